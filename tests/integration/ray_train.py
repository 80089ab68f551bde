"""Ray Train's TorchTrainer on a local Ray cluster, 2 CPU workers, once over gloo and once over
pydist (one cluster for both runs). Ray's workers make the group with
``TorchConfig(backend=...)``: they never import pydist, so "pydist" is known to torch only
through the ``torch.backends`` entry point that torch loads at import (its device-backend
autoload). Prints a RESULT line per backend and rank.

    python ray_train.py OUTDIR
"""
from __future__ import annotations

import os
import sys

import ray
import torch
from _worker import TIMEOUT, fit, rank_batches, report
from _worker import make_model as seeded_model
from ray.train import ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer


def train_loop(config: dict) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)  # 2 workers share 2 cores
    context = ray.train.get_context()
    rank, size = context.get_world_rank(), context.get_world_size()
    model = ray.train.torch.prepare_model(seeded_model(0))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loss = fit(model, optimizer, rank_batches(rank, size))
    report(f"ray-{config['backend']}", config["outdir"], rank, model.module, loss,
           group_backend=dist.get_backend())


def main() -> None:
    outdir = sys.argv[1]
    tests = os.path.dirname(os.path.abspath(__file__))
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": tests}})
    try:
        for backend in ("gloo", "pydist"):
            TorchTrainer(train_loop, train_loop_config={"backend": backend, "outdir": outdir},
                         scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                         torch_config=TorchConfig(backend=backend, timeout_s=int(TIMEOUT.total_seconds())),
                         ).fit()
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
