"""One rank of: 16 MiB collectives in a loop (argv[2]: broadcast from rank 0, the default, or
all_reduce); rank argv[3] (default 0) SIGKILLs itself after argv[1] seconds. A survivor prints
one JSON line: its rank, the seconds from the kill to its exception, the exception's type, its
``rank`` attribute and its text; then it stays alive (as a training script that logs would),
so its sockets stay open, until every survivor has raised: each marks that it has in the
directory argv[4] and waits for the others' marks (at most STAY_S seconds)."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import sys
import threading
import time
from datetime import timedelta

import numpy as np

import pydist as dist

delay = float(sys.argv[1])
op = sys.argv[2] if len(sys.argv) > 2 else "broadcast"
victim = int(sys.argv[3]) if len(sys.argv) > 3 else 0
raised_dir = pathlib.Path(sys.argv[4])
#: how long a survivor waits for the others to raise: past it, one of them hung (the test says so)
STAY_S = 60.0
dist.init_process_group("pydist", timeout=timedelta(seconds=30))
rank = dist.get_rank()
buffer = np.zeros(4 << 20, np.float32)
dist.barrier()
started = time.monotonic()
if rank == victim:
    threading.Timer(delay, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
try:
    while True:
        if op == "broadcast":
            dist.broadcast(buffer, src=0)
        else:
            dist.all_reduce(buffer)
except Exception as error:  # noqa: BLE001 - what the survivors raise is the point
    print(json.dumps({"rank": rank, "after_kill_s": time.monotonic() - started - delay,
                      "type": type(error).__name__, "error_rank": getattr(error, "rank", None),
                      "message": str(error)}), flush=True)
    (raised_dir / str(rank)).touch()
    ends = time.monotonic() + STAY_S
    while len(list(raised_dir.iterdir())) < dist.get_world_size() - 1 and time.monotonic() < ends:
        time.sleep(0.01)  # marks other processes write: nothing to wait on but the file system
