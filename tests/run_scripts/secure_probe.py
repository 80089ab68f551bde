"""Worker for tests/test_security_launcher.py: ``secure_probe.py MODE DIR``.

MODE: pydist (pydist's API; over TCP when PYDIST_SHM=0), gloo or torch-pydist (torch's
init_process_group with that backend), gloo-tcp (gloo with
``init_method="tcp://MASTER_ADDR:MASTER_PORT"``, rank and world size given, as torch's tcp://
requires). Every rank joins the job; rank 0 writes
``DIR/store`` ("MASTER_ADDR MASTER_PORT") and ``DIR/secret`` (the PYDIST_AUTH_TOKEN it got,
for the test's leak check); then every rank waits (up to 60 s) for ``DIR/go``, which the
test writes once its outsider is done, all-reduces rank + 1 and prints
``RESULT rank [values]``.
"""
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

mode, folder = sys.argv[1], Path(sys.argv[2])
if mode == "pydist":
    import numpy as np

    import pydist as dist

    dist.init_process_group(timeout=timedelta(seconds=60))
    data = np.full(4, float(dist.get_rank() + 1))
else:
    import torch
    import torch.distributed as dist  # type: ignore[no-redef]

    backend = {"torch-pydist": "pydist", "gloo-tcp": "gloo"}.get(mode, mode)
    where = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}" if mode == "gloo-tcp" else None
    given = {"rank": int(os.environ["RANK"]), "world_size": int(os.environ["WORLD_SIZE"])} if where else {}
    dist.init_process_group(backend, init_method=where, timeout=timedelta(seconds=60), **given)
    data = torch.full((4,), float(dist.get_rank() + 1))

if dist.get_rank() == 0:
    (folder / "secret.tmp").write_text(os.environ.get("PYDIST_AUTH_TOKEN", ""))
    (folder / "secret.tmp").rename(folder / "secret")
    (folder / "store.tmp").write_text(f"{os.environ['MASTER_ADDR']} {os.environ['MASTER_PORT']}")
    (folder / "store.tmp").rename(folder / "store")
deadline = time.monotonic() + 60
while not (folder / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
dist.all_reduce(data)
print(f"RESULT {dist.get_rank()} {[float(x) for x in data]}", flush=True)
dist.destroy_process_group()
