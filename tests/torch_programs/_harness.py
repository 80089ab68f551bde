"""Shared by the torch programs: run a rank function on 2 forked processes over the backend
named in argv[1] ("gloo" or "pydist"), then print one line ``RESULT {json}`` holding what
every rank returned. A rank that fails makes the script exit 1 with its traceback."""
from __future__ import annotations

import gc
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

WORLD_SIZE = 2
RANK_TIMEOUT = timedelta(seconds=60)  # a hung collective fails the run instead of waiting 30 min
RUN_TIMEOUT = 150.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def state(module: torch.nn.Module) -> dict[str, list]:
    """The module's parameters and buffers as nested lists (JSON), by state_dict name."""
    return {name: value.detach().tolist() for name, value in module.state_dict().items()}


def emit(result: Any) -> None:
    """Print the result line the tests parse, in one write: under a launcher that shares one
    unbuffered pipe among ranks (torchrun), print's separate newline let another rank's line in."""
    sys.stdout.write(f"RESULT {json.dumps(result)}\n")
    sys.stdout.flush()


def init_from_env(backend: str) -> None:
    """init_process_group as a torchrun script does (env://), with the tests' timeout."""
    torch.set_num_threads(1)  # 2 ranks share 2 cores
    dist.init_process_group(backend, timeout=RANK_TIMEOUT)


def collect_before_exit() -> None:
    """Collect garbage now, after the caller dropped its DDP model. torch's DDP keeps the gloo
    process group alive (reference cycles) past destroy_process_group until the interpreter's
    final collection, when gloo's worker thread may free its last Work's Python state without
    the GIL and abort the rank ("terminate called without an active exception"; torch alone,
    gloo DDP + destroy_process_group + exit: 7 of 40 torchrun runs here). Collected while
    Python is alive, the group's threads are joined cleanly (0 of 40)."""
    gc.collect()


def _rank(rank: int, port: int, backend: str, body: Callable, workdir: str, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD_SIZE), LOCAL_WORLD_SIZE=str(WORLD_SIZE))
    try:
        init_from_env(backend)
        value = body(rank, WORLD_SIZE, workdir)
        dist.destroy_process_group()
        results.put((rank, True, value))
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put((rank, False, traceback.format_exc()))


def _reap(procs: list) -> None:
    """Give every rank 5 s to exit, then kill the ones still running."""
    for proc in procs:
        proc.join(5)
    for proc in [proc for proc in procs if proc.is_alive()]:
        proc.kill()
        proc.join()


def main(body: Callable[[int, int, str], Any]) -> None:
    """Run ``body(rank, world_size, workdir)`` on 2 forked ranks over the backend argv[1] names
    (workdir: a directory both ranks share); print their results, or exit 1 naming the failure."""
    backend = sys.argv[1]
    if backend not in ("gloo", "pydist"):
        sys.exit(f"backend (argv[1]): expected gloo or pydist, got {backend!r}")
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    with tempfile.TemporaryDirectory(prefix="torch-program-") as workdir:
        port = free_port()
        procs = [context.Process(target=_rank, args=(rank, port, backend, body, workdir, results))
                 for rank in range(WORLD_SIZE)]
        for proc in procs:
            proc.start()
        collected: dict[int, Any] = {}
        try:
            while len(collected) < WORLD_SIZE:
                rank, ok, value = results.get(timeout=RUN_TIMEOUT)
                if not ok:
                    sys.exit(f"rank {rank} failed on {backend}:\n{value}")
                collected[rank] = value
        finally:
            _reap(procs)
    emit({"backend": backend, "ranks": [collected[rank] for rank in range(WORLD_SIZE)]})


def make_model(seed: int = 0, hidden: int = 16) -> torch.nn.Module:
    """A small MLP (8 -> hidden -> 3), the same on every rank for a given seed."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 3))


def rank_batches(rank: int, steps: int, rows: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` (inputs, class targets) batches of ``rows`` rows, different on every rank."""
    generator = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(rows, 8, generator=generator), torch.randint(0, 3, (rows,), generator=generator))
            for _ in range(steps)]


def loss_of(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return torch.nn.functional.cross_entropy(model(inputs), targets)
