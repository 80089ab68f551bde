"""One rank of: 16 MiB collectives in a loop (argv[2]: broadcast from rank 0, the default, or
all_reduce); rank argv[3] (default 0) SIGKILLs itself after argv[1] seconds. A survivor prints
one JSON line: its rank, the seconds from the kill to its exception, the exception's type, its
``rank`` attribute and its text; then it stays alive a moment (as a training script that logs
would), so its sockets stay open."""
from __future__ import annotations

import json
import os
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
    time.sleep(2)
