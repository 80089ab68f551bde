"""submitit's LocalExecutor, 2 tasks on this host, each running ``train`` over BACKEND:
``TorchDistributedEnvironment().export()`` sets torch's env:// variables, then
``init_process_group(BACKEND)`` with no URL. Prints each task's RESULT line.

    python submitit_local.py gloo|pydist OUTDIR
"""
from __future__ import annotations

import os

import submitit
import torch
from _worker import TIMEOUT, args, fit, rank_batches, report
from _worker import make_model as seeded_model


def train(backend: str, outdir: str) -> str:
    import torch.distributed as dist
    from submitit.helpers import TorchDistributedEnvironment

    torch.set_num_threads(1)  # 2 tasks share 2 cores
    environment = TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    dist.init_process_group(backend, timeout=TIMEOUT)
    model = torch.nn.parallel.DistributedDataParallel(seeded_model(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss = fit(model, optimizer, rank_batches(environment.rank, environment.world_size), epochs=1)
    report(f"submitit-{backend}", outdir, environment.rank, model.module, loss,
           group_backend=dist.get_backend(), world_size=dist.get_world_size())
    del model
    dist.destroy_process_group()
    return "ok"


def main() -> None:
    backend, outdir = args()
    here = os.path.dirname(os.path.abspath(__file__))  # the tasks unpickle references to _worker
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    executor = submitit.LocalExecutor(folder=os.path.join(outdir, "submitit"))
    executor.update_parameters(nodes=1, tasks_per_node=2, timeout_min=10)
    job = executor.submit(train, backend, outdir)
    assert job.results() == ["ok", "ok"], job.results()
    for task in range(2):
        print(job.task(task).stdout())


if __name__ == "__main__":
    main()
