"""Run by tests/test_torch_launcher_env.py under mpiexec or a simulated srun / submitit:
``torch.distributed.init_process_group("pydist")`` with no init_method and none of torch's
variables set (pydist reaches torch only through the backend autoload: no pydist import
here), one all_reduce, then one line ``RESULT {json}``: rank, size, the sum, and torch's
variables before and after init_process_group."""
import json
import os

import torch
import torch.distributed as dist

NAMES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
before = {name: os.environ.get(name) for name in NAMES}
dist.init_process_group("pydist")
rank, size = dist.get_rank(), dist.get_world_size()
values = torch.tensor([rank + 1.0, 1.0])
dist.all_reduce(values)
result = json.dumps({"rank": rank, "size": size, "sum": values.tolist(), "before": before,
                     "after": {name: os.environ.get(name) for name in NAMES},
                     "backend": dist.get_backend()})
os.write(1, f"RESULT {result}\n".encode())  # one write: ranks sharing a pipe do not interleave
dist.destroy_process_group()
