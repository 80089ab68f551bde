"""One rank of: 1 MiB all_reduces in a loop, timeout argv[1] seconds, until the network is
cut. Creates the file argv[2]/ready-<rank> once in the loop; prints a JSON line {"rank",
"raised" (wall-clock time), "type", "message"} when an operation raises."""
from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np

import pydist as dist

dist.init_process_group("pydist", timeout=timedelta(seconds=float(sys.argv[1])))
rank = dist.get_rank()
tensor = np.ones(1 << 18, np.float32)
dist.all_reduce(tensor)
Path(sys.argv[2], f"ready-{rank}").touch()
try:
    while True:
        dist.all_reduce(tensor)
except Exception as error:  # noqa: BLE001 - what each rank raises is the point
    print(json.dumps({"rank": rank, "raised": time.time(), "type": type(error).__name__,
                      "message": str(error)}), flush=True)
