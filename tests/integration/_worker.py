"""Shared by the framework worker scripts beside it: the model, the data, and the result each
rank reports. Every script takes ``BACKEND OUTDIR`` ("gloo" or "pydist", a directory the ranks
share), trains the same seeded model on the same data, writes its parameters' raw bytes to
``OUTDIR/<name>-rank<r>.bin`` and prints one line ``RESULT {json}`` (rank, final loss, the
parameters' sha256), which tests/integration/test_frameworks.py compares between backends."""
from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from datetime import timedelta

import torch

TIMEOUT = timedelta(seconds=120)  # a hung collective fails the run instead of waiting 30 min
FEATURES = 8
SAMPLES = 64


def args() -> tuple[str, str]:
    """(backend, outdir) from the command line."""
    backend, outdir = sys.argv[1], sys.argv[2]
    assert backend in ("gloo", "pydist"), backend
    return backend, outdir


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def make_data() -> torch.utils.data.TensorDataset:
    """SAMPLES rows of a noisy linear target, the same in every process."""
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = x @ torch.linspace(-1.0, 1.0, FEATURES).unsqueeze(1) + 0.1 * torch.randn(SAMPLES, 1, generator=generator)
    return torch.utils.data.TensorDataset(x, y)


def rank_batches(rank: int, world_size: int, batch_size: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's share of the data (every world_size-th row, as DistributedSampler without
    shuffling gives it), in batches."""
    x, y = make_data().tensors
    x, y = x[rank::world_size], y[rank::world_size]
    return [(x[i:i + batch_size], y[i:i + batch_size]) for i in range(0, len(x), batch_size)]


def fit(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Iterable, epochs: int = 3,
        backward: Callable[[torch.Tensor], None] = torch.Tensor.backward) -> float:
    """Train ``epochs`` passes over ``batches`` (``backward`` as the framework asks for it); the
    last batch's loss."""
    for _ in range(epochs):
        for x, y in batches:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            backward(loss)
            optimizer.step()
    return loss.item()


def parameter_bytes(module: torch.nn.Module) -> bytes:
    """Every parameter's raw bytes, in state_dict order (a wrapper's "module." prefix aside)."""
    return b"".join(value.detach().contiguous().numpy().tobytes() for value in module.state_dict().values())


def report(name: str, outdir: str, rank: int, module: torch.nn.Module, loss: float, **extra) -> None:
    """Write the parameters' bytes for the test to compare, and print the RESULT line (one write:
    ranks may share one pipe)."""
    data = parameter_bytes(module)
    with open(os.path.join(outdir, f"{name}-rank{rank}.bin"), "wb") as file:
        file.write(data)
    result = {"name": name, "rank": rank, "loss": float(loss), "sha256": hashlib.sha256(data).hexdigest(), **extra}
    sys.stdout.write(f"RESULT {json.dumps(result)}\n")
    sys.stdout.flush()
