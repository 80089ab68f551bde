"""Models, data, DDP rank functions and single-process references for tests/test_ddp_training.py.

Every rank function is ``fn(rank, size, ...)`` and returns plain data (parameter tensors,
names, stats), so the same code runs on thread-ranks and on process-ranks. Rank ``r``
trains on rows ``[r * per_rank, (r + 1) * per_rank)`` of each global batch; with equal
slices, the average of the per-rank mean losses is the full-batch mean loss, so DDP must
match single-process training on the whole batch.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from pydist.torch import hooks
from pydist.torch.ddp import DistributedDataParallel

LR = 0.1
IN, OUT = 8, 4


class Mlp(nn.Sequential):
    def __init__(self) -> None:
        super().__init__(nn.Linear(IN, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, OUT))


class BnNet(nn.Sequential):
    """Buffers: BatchNorm's running statistics (each rank normalises with its own batch)."""

    def __init__(self) -> None:
        super().__init__(nn.Linear(IN, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, OUT))


class WithUnused(nn.Module):
    """``extra`` is used only when asked; ``never`` is never used."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(IN, OUT)
        self.extra = nn.Linear(IN, OUT)
        self.never = nn.Linear(IN, OUT)

    def forward(self, x: torch.Tensor, use_extra: bool = False) -> torch.Tensor:
        out = self.body(x)
        return out + self.extra(x) if use_extra else out


class Swapped(nn.Module):
    """Registered [first, second] but used second-then-first: gradients of ``first`` come first."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(16, OUT)
        self.second = nn.Linear(IN, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.first(torch.relu(self.second(x)))


MODELS: dict[str, Callable[[], nn.Module]] = {"mlp": Mlp, "bn": BnNet, "unused": WithUnused, "swapped": Swapped}


_SEEDING = threading.Lock()  # torch's default generator is shared by thread-ranks


def make_model(name: str, seed: int = 0) -> nn.Module:
    with _SEEDING:
        torch.manual_seed(seed)
        return MODELS[name]()


def batches(steps: int, rows: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, IN, generator=generator), torch.randn(rows, OUT, generator=generator))
            for _ in range(steps)]


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out, y)


def state_of(module: nn.Module) -> dict[str, np.ndarray]:
    """Parameters and buffers as numpy arrays (torch tensors would cross process boundaries
    as shared-memory handles that die with the rank's process)."""
    return {name: t.detach().numpy().copy() for name, t in module.state_dict().items()}


HOOKS = {"allreduce": hooks.allreduce_hook, "fp16": hooks.fp16_compress_hook, "bf16": hooks.bf16_compress_hook}


def train(rank: int, size: int, model: str = "mlp", steps: int = 4, per_rank: int = 4, hook: str | None = None,
          **ddp_kwargs: Any) -> dict[str, Any]:
    """DDP training, rank ``rank`` on its slice; models start from a different seed per rank
    (construction must broadcast rank 0's). Returns the module state, buckets and stats."""
    torch.set_num_threads(1)
    ddp = DistributedDataParallel(make_model(model, seed=rank), **ddp_kwargs)
    if hook is not None:
        ddp.register_comm_hook(None, HOOKS[hook])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    for x, y in batches(steps, size * per_rank):
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        optimizer.zero_grad()
        loss_fn(ddp(x[rows]), y[rows]).backward()
        optimizer.step()
    grads_are_views = all(any(p.grad.data_ptr() == v.data_ptr() for b in ddp.reducer.buckets for v in b.views)
                          for p in ddp.parameters())
    return {"state": state_of(ddp.module), "keys": list(ddp.state_dict()), "buckets": ddp._get_bucket_params(),
            "stats": ddp.comm_stats(), "grads_are_views": grads_are_views}


def reference(model: str = "mlp", steps: int = 4, size: int = 2, per_rank: int = 4) -> dict[str, torch.Tensor]:
    """Single-process training on the whole batches. For BatchNorm, each slice is normalised
    by itself (as on its rank) and the running statistics end as rank 0's: each step starts
    from the previous step's rank-0 buffers (DDP broadcasts them) and slice 0 goes last."""
    net = make_model(model)
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    for x, y in batches(steps, size * per_rank):
        optimizer.zero_grad()
        if model == "bn":
            start = {(module, name): b.clone() for module in net.modules() for name, b in module._buffers.items()}
            losses = []
            for r in [*range(1, size), 0]:
                for (module, name), buffer in start.items():  # fresh tensors: the old ones are saved for backward
                    module._buffers[name] = buffer.clone()
                rows = slice(r * per_rank, (r + 1) * per_rank)
                losses.append(loss_fn(net(x[rows]), y[rows]))
            (sum(losses) / size).backward()
        else:
            loss_fn(net(x), y).backward()
        optimizer.step()
    return state_of(net)


def train_no_sync(rank: int, size: int, micro_steps: int = 3, steps: int = 2, per_rank: int = 2,
                  **ddp_kwargs: Any) -> dict[str, Any]:
    """Each step: ``micro_steps - 1`` backward passes under no_sync, then one synced."""
    torch.set_num_threads(1)
    ddp = DistributedDataParallel(make_model("mlp"), **ddp_kwargs)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    data = batches(steps * micro_steps, size * per_rank)
    after_no_sync = []
    for step in range(steps):
        optimizer.zero_grad()
        for micro in range(micro_steps):
            x, y = data[step * micro_steps + micro]
            rows = slice(rank * per_rank, (rank + 1) * per_rank)
            if micro < micro_steps - 1:
                with ddp.no_sync():
                    loss_fn(ddp(x[rows]), y[rows]).backward()
                after_no_sync.append(ddp.comm_stats()["allreduces"])
            else:
                loss_fn(ddp(x[rows]), y[rows]).backward()
        optimizer.step()
    return {"state": state_of(ddp.module), "allreduces_after_no_sync": after_no_sync,
            "stats": ddp.comm_stats(), "buckets": len(ddp.bucket_indices)}


def reference_no_sync(size: int, micro_steps: int = 3, steps: int = 2, per_rank: int = 2) -> dict[str, torch.Tensor]:
    """One step per ``micro_steps`` batches: the sum over micro-batches of the full-batch mean loss."""
    net = make_model("mlp")
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    data = batches(steps * micro_steps, size * per_rank)
    for step in range(steps):
        optimizer.zero_grad()
        sum(loss_fn(net(x), y) for x, y in data[step * micro_steps:(step + 1) * micro_steps]).backward()
        optimizer.step()
    return state_of(net)


def train_join(rank: int, size: int, counts: list[int], divide_by_initial_world_size: bool = True,
               per_rank: int = 4, model: str = "mlp", hook: str | None = None, **ddp_kwargs: Any) -> dict[str, Any]:
    """Uneven inputs: rank r trains on ``counts[r]`` batches inside ``ddp.join()``."""
    torch.set_num_threads(1)
    ddp = DistributedDataParallel(make_model(model, seed=rank), **ddp_kwargs)
    if hook is not None:
        ddp.register_comm_hook(None, HOOKS[hook])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    data = batches(max(counts), size * per_rank)[:counts[rank]]
    with ddp.join(divide_by_initial_world_size=divide_by_initial_world_size):
        for x, y in data:
            rows = slice(rank * per_rank, (rank + 1) * per_rank)
            optimizer.zero_grad()
            loss_fn(ddp(x[rows]), y[rows]).backward()
            optimizer.step()
    return {"state": state_of(ddp.module), "stats": ddp.comm_stats()}


def reference_join(size: int, counts: list[int], divide_by_initial_world_size: bool = True,
                   per_rank: int = 4) -> dict[str, torch.Tensor]:
    """torch's Join semantics: a joined rank contributes zeros; the divisor is the initial
    world size (or the number of ranks still training)."""
    net = make_model("mlp")
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    for step, (x, y) in enumerate(batches(max(counts), size * per_rank)):
        active = [r for r in range(size) if counts[r] > step]
        divisor = size if divide_by_initial_world_size else len(active)
        optimizer.zero_grad()
        losses = [loss_fn(net(x[r * per_rank:(r + 1) * per_rank]), y[r * per_rank:(r + 1) * per_rank])
                  for r in active]
        (sum(losses) / divisor).backward()
        optimizer.step()
    return state_of(net)


def train_unused(rank: int, size: int, steps: int = 3, per_rank: int = 4, extra_on: tuple[int, ...] = (),
                 **ddp_kwargs: Any) -> dict[str, Any]:
    """WithUnused: ``extra`` is used by the ranks in ``extra_on``, ``never`` by none. Returns
    the state, or the error a forward raised (and at which step)."""
    torch.set_num_threads(1)
    ddp = DistributedDataParallel(make_model("unused", seed=rank), **ddp_kwargs)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=LR)
    for step, (x, y) in enumerate(batches(steps, size * per_rank)):
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        optimizer.zero_grad()
        try:
            out = ddp(x[rows], use_extra=rank in extra_on)
        except RuntimeError as error:
            return {"error": str(error), "step": step}
        loss_fn(out, y[rows]).backward()
        optimizer.step()
    grads = {name: None if p.grad is None else p.grad.numpy().copy() for name, p in ddp.module.named_parameters()}
    return {"state": state_of(ddp.module), "grads": grads}


def reference_unused(size: int, steps: int = 3, per_rank: int = 4, extra_on: tuple[int, ...] = ()) -> dict:
    net = make_model("unused")
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    for x, y in batches(steps, size * per_rank):
        optimizer.zero_grad()
        losses = [loss_fn(net(x[r * per_rank:(r + 1) * per_rank], use_extra=r in extra_on),
                          y[r * per_rank:(r + 1) * per_rank]) for r in range(size)]
        (sum(losses) / size).backward()
        optimizer.step()
    return state_of(net)
