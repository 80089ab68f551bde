"""torch.distributed over pydist's MPI backend, run by every rank under mpiexec (test_mpi_backend.py).

Usage: mpi_torch.py options PARAMS_PATH | mpi_torch.py env
Both rendezvous through ``mpi://`` (no MASTER_ADDR, RANK...) and write each rank's result to
$PYDIST_RESULTS/<rank>.json.
``options`` selects MPI with pg_options=pydist.torch.Options("mpi") and runs test_torch_plugin's
every-call check and its torch DDP training; rank 0 saves the trained parameters to
PARAMS_PATH (.npz). ``env`` relies on PYDIST_BACKEND=mpi set by the caller and reports the
engine of the default group and of a new_group, and an all_reduce.
"""
import json
import os
import sys
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as tdist
from test_torch_plugin import _every_call, _torch_ddp  # tests/ on PYTHONPATH (tests/child_env.py)

import pydist.torch

DDP_STEPS = 5


def run_every_call(rank: int, size: int, params_path: str) -> dict:
    out = _every_call(rank, size)
    params = _torch_ddp(rank, size, DDP_STEPS)
    if rank == 0:
        np.savez(params_path, *params)
    return out


def run_env_switch(rank: int, size: int) -> dict:
    t = torch.full((2,), float(rank))
    tdist.all_reduce(t)
    sub = tdist.new_group(list(range(size)))
    return {"all_reduce": t.tolist(), "sub_engine": sub.engine}


def main(mode: str, params_path: str = "") -> None:
    options = pydist.torch.Options("mpi") if mode == "options" else None
    tdist.init_process_group("pydist", init_method="mpi://", pg_options=options, timeout=timedelta(seconds=60))
    rank, size = tdist.get_rank(), tdist.get_world_size()
    out = run_every_call(rank, size, params_path) if mode == "options" else run_env_switch(rank, size)
    out["engine"] = tdist.group.WORLD.engine
    tdist.destroy_process_group()
    with open(os.path.join(os.environ["PYDIST_RESULTS"], f"{rank}.json"), "w") as file:
        json.dump(out, file)


if __name__ == "__main__":
    main(*sys.argv[1:])
