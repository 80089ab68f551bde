"""DeepSpeed on CPU (``DS_ACCELERATOR=cpu``) under torchrun on BACKEND:
``deepspeed.init_distributed(dist_backend=BACKEND)``, then the same seeded model trained with
ZeRO stages 0, 1, 2 and 3 in turn (fp32, torch's Adam), each reporting its gathered parameters.

DeepSpeed's CPU accelerator JIT-compiles a C++ shared-memory op at init (minutes on 2 cores,
then cached in ~/.cache/torch_extensions) that only its ``inference_all_reduce`` uses; training's
collectives go through torch.distributed. The worker turns that op off, so a fresh machine
compiles nothing and every collective DeepSpeed makes goes through the backend under test.

    DS_ACCELERATOR=cpu torchrun --nproc-per-node 2 deepspeed_zero.py gloo|pydist OUTDIR
"""
from __future__ import annotations

import importlib

import deepspeed
import torch
import torch.distributed as dist
from _worker import TIMEOUT, args, make_model, rank_batches, report

BATCH = 8


def config(stage: int) -> dict:
    return {"train_micro_batch_size_per_gpu": BATCH, "gradient_accumulation_steps": 1,
            "optimizer": {"type": "Adam", "params": {"lr": 0.01, "torch_adam": True}},
            "zero_optimization": {"stage": stage}, "steps_per_print": 10**9}


def main() -> None:
    backend, outdir = args()
    torch.set_num_threads(1)  # 2 ranks share 2 cores
    # see above; by import_module: deepspeed.comm's attribute "torch" is torch itself
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend=backend, timeout=TIMEOUT)
    rank, size = dist.get_rank(), dist.get_world_size()
    for stage in range(4):
        engine, *_ = deepspeed.initialize(model=make_model(), model_parameters=None, config=config(stage))
        for _ in range(3):
            for x, y in rank_batches(rank, size, BATCH):
                loss = torch.nn.functional.mse_loss(engine(x), y)
                engine.backward(loss)
                engine.step()
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=stage == 3):
            report(f"deepspeed-zero{stage}", outdir, rank, engine.module, loss.item(), backend=dist.get_backend())
        engine.destroy()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
