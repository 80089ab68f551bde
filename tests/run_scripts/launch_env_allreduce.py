"""Run by tests/test_rendezvous_launch_env.py under mpiexec, torchrun, pydist-run or a simulated srun:
``init_process_group()`` with no arguments, one all_reduce, then one line
``RESULT {json}`` with what this rank saw (rank, size, the sum, and its launch_info)."""
import json
import os

import numpy as np

import pydist as dist
from pydist.rendezvous import launch_info

info = launch_info()
dist.init_process_group()
rank, size = dist.get_rank(), dist.get_world_size()
values = np.array([rank + 1.0, 1.0])
dist.all_reduce(values)
result = json.dumps({"rank": rank, "size": size, "sum": values.tolist(), "launcher": info.launcher,
                     "local_rank": info.local_rank, "local_world_size": info.local_world_size,
                     "addr": info.master_addr, "port": info.master_port})
os.write(1, f"RESULT {result}\n".encode())  # one write: ranks sharing a pipe do not interleave
dist.destroy_process_group()
