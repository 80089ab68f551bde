"""Data-parallel training of a small MLP on scikit-learn's digits, with pydist.

    pydist-run --nproc-per-node 2 -m pydist.examples.train [--epochs 15] [--snapshot PATH]

Every rank trains on its DistributedSampler share of the training images; pydist's
DistributedDataParallel averages the gradients. Rank 0 prints the per-epoch loss (the
mean over all ranks) and the held-out accuracy, saves a snapshot after each epoch and,
when rerun, resumes from it. The run ends with a one-line communication summary.

``--backend gloo --ddp torch`` runs the same training on torch's gloo backend and torch's
DDP (and ``--backend pydist --ddp torch`` torch's DDP over pydist's plugin), to compare
step times side by side. ``--fault-tolerant`` trains on through the loss of workers and takes
their replacements in (``pydist.Elastic``; see fault_tolerant.py and chaos.py).
"""
from __future__ import annotations

import argparse
import importlib
import os
import time

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

try:
    from sklearn.datasets import load_digits
except ImportError as missing:  # the demo extra brings it
    raise SystemExit("pydist.examples.train learns scikit-learn's digits: pip install scikit-learn "
                     "(or pydist[demo], which brings torch too)") from missing

import pydist
from pydist.data import DistributedSampler


def load_data(held_out: float = 0.2) -> tuple[TensorDataset, TensorDataset]:
    """The digits (8x8 images, 10 classes), standardised, split the same way on every rank."""
    digits = load_digits()
    order = np.random.RandomState(0).permutation(len(digits.target))
    x = digits.data[order].astype(np.float32)
    x = (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-6)
    y = digits.target[order].astype(np.int64)
    cut = int(len(y) * (1 - held_out))
    return (TensorDataset(torch.from_numpy(x[:cut]), torch.from_numpy(y[:cut])),
            TensorDataset(torch.from_numpy(x[cut:]), torch.from_numpy(y[cut:])))


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))


class Communication:
    """Collectives used by the script itself, on pydist or on torch.distributed."""

    def __init__(self, backend: str, ddp: str):
        self.torch_side = backend == "gloo" or ddp == "torch"
        if self.torch_side:
            import torch.distributed as tdist
            self.dist = tdist
            if backend == "pydist":
                importlib.import_module("pydist.torch")  # the plugin (also autoloaded with torch)
            tdist.init_process_group(backend)
        else:
            self.dist = pydist
            pydist.init_process_group(backend)

    def wrap(self, model: torch.nn.Module, ddp: str) -> torch.nn.Module:
        if ddp == "torch":
            return torch.nn.parallel.DistributedDataParallel(model)
        return pydist.DistributedDataParallel(model)

    def mean(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        self.dist.all_reduce(t)
        return t.item() / self.dist.get_world_size()


def accuracy(model: torch.nn.Module, data: TensorDataset) -> float:
    with torch.no_grad():
        x, y = data.tensors
        return (model(x).argmax(dim=1) == y).float().mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--snapshot", default="train_snapshot.pt")
    parser.add_argument("--backend", default="pydist", choices=["pydist", "gloo"])
    parser.add_argument("--ddp", default="pydist", choices=["pydist", "torch"])
    parser.add_argument("--fault-tolerant", action="store_true",
                        help="go on without the workers that die (pydist, pydist DDP; see fault_tolerant.py)")
    parser.add_argument("--kill-rank", type=int, default=-1, help="with --fault-tolerant: this launch rank kills "
                        "itself at --kill-step (a demonstration)")
    parser.add_argument("--kill-step", type=int, default=-1)
    parser.add_argument("--step-seconds", type=float, default=0.0,
                        help="with --fault-tolerant: sleep this long per step (stands for a heavier model)")
    parser.add_argument("--report-events", action="store_true",
                        help="with --fault-tolerant: print EVENT lines for pydist.examples.chaos")
    args = parser.parse_args()
    if args.fault_tolerant:
        from pydist.examples import fault_tolerant
        fault_tolerant.run(args, *load_data(), make_model, accuracy)
        return

    comm = Communication(args.backend, args.ddp)
    rank = comm.dist.get_rank()
    train, held_out = load_data()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start_epoch = 0
    if os.path.exists(args.snapshot):
        snapshot = torch.load(args.snapshot)
        model.load_state_dict(snapshot["model"])
        optimizer.load_state_dict(snapshot["optimizer"])
        start_epoch = snapshot["epoch"]
        if rank == 0:
            print(f"resuming from {args.snapshot} after epoch {start_epoch}", flush=True)
    ddp = comm.wrap(model, args.ddp)
    sampler = DistributedSampler(train, num_replicas=comm.dist.get_world_size(), rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    step_seconds, steps = 0.0, 0
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        ddp.train()
        total = 0.0
        for x, y in loader:
            began = time.perf_counter()
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            step_seconds += time.perf_counter() - began
            steps += 1
            total += loss.item()
        mean_loss = comm.mean(total / len(loader))
        if rank == 0:
            ddp.eval()
            print(f"epoch {epoch + 1:2d}/{args.epochs}  loss {mean_loss:.4f}  "
                  f"held-out accuracy {accuracy(model, held_out) * 100:.1f} %", flush=True)
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1},
                       args.snapshot)
    if rank == 0:
        if steps == 0:
            print(f"nothing to do: {args.snapshot} is already at epoch {start_epoch}; "
                  f"held-out accuracy {accuracy(model, held_out) * 100:.1f} %", flush=True)
        else:
            summary = f"{steps} steps, {step_seconds / steps * 1e3:.2f} ms per step ({args.backend}, {args.ddp} DDP)"
            if hasattr(ddp, "comm_stats"):
                stats = ddp.comm_stats()
                summary += (f"; communication: {stats['bytes_reduced'] / 1e6:.1f} MB reduced in "
                            f"{stats['allreduces']} all_reduces, {stats['seconds_communicating']:.3f} s")
            print(summary, flush=True)
    comm.dist.destroy_process_group()


if __name__ == "__main__":
    main()
