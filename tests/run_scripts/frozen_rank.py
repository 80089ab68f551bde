"""A rank for tests/test_failure_heartbeat.py's frozen and busy peers: all_reduce in a loop,
printing JSON lines (ready; then what it raised, when, and the ranks it knew dead; or done).
``loop``: until an error (the harness stops one rank with SIGSTOP, and resumes it later);
``busy SECONDS ROUNDS``: ROUNDS all_reduces, rank 1 spinning in Python for SECONDS before each;
``starved SECONDS ROUNDS``: the same, rank 1 in a C call that holds the GIL (its pydist threads
cannot run: a process starved of CPU on a loaded machine looks the same to its peers)."""
import ctypes
import json
import os
import sys
import time
from datetime import timedelta

import numpy as np

import pydist as dist


def report(**fields) -> None:
    print(json.dumps({"rank": dist.get_rank(), "pid": os.getpid(), **fields}), flush=True)


def main() -> None:
    dist.init_process_group("pydist", timeout=timedelta(seconds=60))
    buf = np.ones(1024, np.float32)
    report(ready=time.time())
    try:
        if sys.argv[1] in ("busy", "starved"):
            for _ in range(int(sys.argv[3])):
                if dist.get_rank() == 1 and sys.argv[1] == "starved":
                    ctypes.PyDLL(None).usleep(int(float(sys.argv[2]) * 1e6))  # PyDLL: the GIL stays held
                elif dist.get_rank() == 1:
                    end = time.monotonic() + float(sys.argv[2])
                    while time.monotonic() < end:  # pure Python: the pydist threads get the GIL in turns
                        sum(range(1000))
                buf[:] = 1
                dist.all_reduce(buf)
            report(done=time.time(), sum=float(buf[0]))
            dist.destroy_process_group()
            return
        while True:
            buf[:] = 1
            dist.all_reduce(buf)
    except dist.DistError as error:
        report(raised=time.time(), type=type(error).__name__, message=str(error), dead=sorted(error.dead_ranks))
    os._exit(0)


if __name__ == "__main__":
    main()
