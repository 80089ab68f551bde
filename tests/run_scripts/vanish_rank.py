"""A rank for tests/test_failure_heartbeat.py: all_reduce in a loop until it raises; prints JSON lines
(ready, then what it raised, when, and the ranks it knew dead). ``once``: one all_reduce, which
rank 1 starts only after reading a line from its stdin (the harness stops it meanwhile)."""
import json
import os
import sys
import time
from datetime import timedelta

import numpy as np

import pydist as dist


def main() -> None:
    dist.init_process_group("pydist", timeout=timedelta(seconds=60))
    buf = np.ones(1024, np.float32)
    print(json.dumps({"rank": dist.get_rank(), "pid": os.getpid(), "ready": time.time()}), flush=True)
    if sys.argv[1:] == ["once"]:
        if dist.get_rank() == 1:
            sys.stdin.readline()
        dist.all_reduce(buf)
        print(json.dumps({"rank": dist.get_rank(), "done": time.time(), "sum": float(buf[0])}), flush=True)
        dist.destroy_process_group()
        return
    try:
        while True:
            dist.all_reduce(buf)
            buf[:] = 1
    except dist.DistError as error:
        evicted_by = error.rank if isinstance(error, dist.EvictedError) else None
        print(json.dumps({"rank": dist.get_rank(), "raised": time.time(), "type": type(error).__name__,
                          "message": str(error), "dead": sorted(error.dead_ranks), "evicted_by": evicted_by}),
              flush=True)
    os._exit(0)  # the vanished peer's connection cannot close cleanly: leave at once


if __name__ == "__main__":
    main()
