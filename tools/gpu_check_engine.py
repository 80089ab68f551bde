"""gpu-check's checks of pydist's device engine (issue 47 item 6, checks 4-7, 9, 10).

Each check starts its ranks as processes (spawn: CUDA cannot fork) that join one pydist job
(env://) with PYDIST_CUDA_ENGINE=1, every rank on device 0 (one GPU, ranks sharing it), and
returns (status, detail). ``kind`` is "cuda" on a GPU machine, or "standin" (pydist's strict
CPU stand-in of a GPU, with small sizes) so that the script itself runs anywhere:
``python tools/gpu_check.py --device standin``. Sizes and iterations are chosen so that the
whole gpu-check fits 7 minutes on a 16-core machine with one H100/H200.

 4 every collective (and send/recv) correct for float32, bfloat16 and int64, from 1 B to
   256 MiB per rank buffer (as nccl-tests counts: all_gather's output, reduce_scatter's
   input; the list forms, gather, scatter and send/recv to 16 MiB; stand-in: to 64 KiB), at
   2 and 4 ranks, against numpy;
 5 a short run under TORCH_CUDA_SANITIZER=1 (CUDA only): its stream race checks find nothing;
 6 a non-default caller stream, async_op both ways, wait() returning while the device is
   still busy (the caller's stream held back with a delay), results right;
 7 inputs freed right after async calls and torch.cuda.empty_cache() on every rank, their
   memory reused at once: results right, nothing crashes;
 9 a peer killed mid-call: the survivors raise naming it before the deadline (measured);
10 pydist-bench --device cuda against gloo and NCCL, 4 B - 256 MiB, with and without MPS
   (nvidia-cuda-mps-control -d where present, stopped after); the acceptance ratios read off.
"""
from __future__ import annotations

import multiprocessing
import os
import queue
import secrets
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np

from pydist.testing import free_port, stop_processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "src")
Row = tuple[str, str]
BIG = {"cuda": [1, 4096, 1 << 20, 16 << 20, 256 << 20], "standin": [1, 4096, 65536]}
NAMES = ("float32", "bfloat16", "int64")


# -- ranks --------------------------------------------------------------------------------------

def _child(fn: Callable[..., Any], rank: int, size: int, port: int, token: str, env: dict, results: Any,
           args: tuple) -> None:
    os.environ.update(env, RANK=str(rank), WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      PYDIST_CUDA_ENGINE="1", PYDIST_AUTH_TOKEN=token)
    try:
        import pydist
        pydist.init_process_group("pydist", timeout=timedelta(seconds=float(env.get("CHECK_TIMEOUT", "120"))))
        results.put((rank, True, fn(rank, size, *args)))
        pydist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the check
        results.put((rank, False, traceback.format_exc()[-3000:]))


def run_ranks(size: int, fn: Callable[..., Any], *args: Any, limit: float = 240.0, env: dict | None = None,
              wait_for: list[int] | None = None, rank_env: dict[int, dict] | None = None) -> list[Any]:
    """``fn(rank, size, *args)`` in ``size`` processes of one job; their results (a rank's
    failure: RuntimeError with its traceback). ``wait_for``: the ranks whose results count;
    ``rank_env``: a rank's own variables, after ``env`` (PYDIST_HOST_ID: ranks as hosts)."""
    port = free_port()
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    token = secrets.token_hex(16)  # the job's own secret: its store and ports closed to others
    envs = [{**(env or {}), **(rank_env or {}).get(r, {})} for r in range(size)]
    procs = [context.Process(target=_child, args=(fn, r, size, port, token, envs[r], results, args))
             for r in range(size)]
    for proc in procs:
        proc.start()
    wanted = set(range(size) if wait_for is None else wait_for)
    found: dict[int, Any] = {}
    try:
        deadline = time.monotonic() + limit
        while wanted - found.keys():
            try:
                rank, ok, value = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"ranks {sorted(wanted - found.keys())} did not finish within {limit} s") from None
            if not ok and rank in wanted:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            found[rank] = value
    finally:
        stop_processes(procs, 10)
    return [found[rank] for rank in sorted(wanted)]


# -- tensors on either kind of device ---------------------------------------------------------------

class On:
    """Arrays of ``kind`` ("cuda": torch on cuda:0; "standin") made from and read into numpy
    (bfloat16 read back as float32 values)."""

    def __init__(self, kind: str, rank: int):
        self.kind = kind
        if kind == "cuda":
            import torch
            torch.cuda.set_device(0)
            self.torch, self.where = torch, torch.device("cuda", 0)
        else:
            from pydist.device import open_device
            self.device = open_device("standin", 0, rank)

    def up(self, host: np.ndarray, name: str) -> Any:
        if self.kind == "cuda":
            tensor = self.torch.from_numpy(np.ascontiguousarray(host))
            return tensor.to(self.where).to(getattr(self.torch, name))
        from pydist.core.buffers import float32_to_bf16_bits
        bits = float32_to_bf16_bits(host.astype(np.float32)) if name == "bfloat16" else host.astype(name)
        return self.device.from_host(bits, name, self.device.current_stream())

    def empty(self, count: int, name: str) -> Any:
        if self.kind == "cuda":
            return self.torch.full((count,), -7, dtype=getattr(self.torch, name), device=self.where)
        return self.device.empty((count,), name)

    def down(self, array: Any) -> np.ndarray:
        if self.kind == "cuda":
            tensor = array.float() if array.dtype == self.torch.bfloat16 else array
            return tensor.cpu().numpy()
        from pydist.core.buffers import bf16_bits_to_float32
        from pydist.core.deadline import Deadline
        host = self.device.to_host(array, self.device.current_stream(), Deadline.after(120))
        return bf16_bits_to_float32(host) if self.device.describe(array)[0].name == "bfloat16" else host

    def stream(self) -> Any:
        """A new stream (torch's on CUDA), to call from."""
        return self.torch.cuda.Stream() if self.kind == "cuda" else self.device.new_stream()


def values(count: int, rank: int, name: str, salt: int = 0, start: int = 0) -> np.ndarray:
    """Elements [start, start + count) of rank ``rank``'s input: small integers, exact in
    every dtype (sums of 4 ranks below 128), cheap to reduce by formula."""
    base = (np.arange(start, start + count, dtype=np.int64) * 7 + salt) % 29
    return (base + rank).astype(np.float32 if name != "int64" else np.int64)


# -- check 4 ----------------------------------------------------------------------------------------

def wrong_collectives(rank: int, size: int, kind: str, sizes: list[int]) -> list[str]:
    """Every collective and send/recv at every size and dtype; the wrong ones, named (check 4,
    and check 8 with ranks as hosts)."""
    import pydist
    on, wrong = On(kind, rank), []
    for name in NAMES:
        itemsize = 2 if name == "bfloat16" else 8 if name == "int64" else 4
        for nbytes in sizes:
            n = max(1, nbytes // itemsize // size)  # per-rank part; whole buffers n * size
            mine = values(n * size, rank, name)
            total = values(n * size, 0, name) * size + size * (size - 1) // 2
            checks: dict[str, tuple[Any, np.ndarray]] = {}
            x = on.up(mine, name)
            pydist.all_reduce(x)
            checks["all_reduce"] = x, total
            y = on.up(mine, name)
            pydist.broadcast(y, src=size - 1)
            checks["broadcast"] = y, values(n * size, size - 1, name)
            z = on.up(mine, name)
            pydist.reduce(z, dst=0)
            checks["reduce"] = z, total if rank == 0 else mine
            gathered = on.empty(n * size, name)
            pydist.all_gather_into_tensor(gathered, on.up(mine[:n], name))
            checks["all_gather_into_tensor"] = gathered, np.concatenate([values(n, r, name) for r in range(size)])
            scattered = on.empty(n, name)
            pydist.reduce_scatter_tensor(scattered, on.up(mine, name))
            checks["reduce_scatter_tensor"] = scattered, total[rank * n:(rank + 1) * n]
            swapped = on.empty(n * size, name)
            pydist.all_to_all_single(swapped, on.up(mine, name))
            checks["all_to_all_single"] = swapped, np.concatenate(
                [values(n, r, name, start=rank * n) for r in range(size)])
            parts = [on.empty(n, name) for _ in range(size)]
            pydist.all_gather(parts, on.up(mine[:n], name))
            for r, part in enumerate(parts):
                checks[f"all_gather[{r}]"] = part, values(n, r, name)
            if nbytes <= 16 << 20:  # the other list forms and point-to-point: to 16 MiB
                _small(pydist, on, rank, size, n, name, mine, total, checks)
            for what, (array, expected) in checks.items():
                got = on.down(array)
                if got.shape != expected.shape or not np.array_equal(got, expected.astype(got.dtype)):
                    wrong.append(f"{what} {name} {nbytes} B at {size} ranks (rank {rank})")
            del checks
    return wrong


def _small(pydist: Any, on: On, rank: int, size: int, n: int, name: str, mine: np.ndarray, total: np.ndarray,
           checks: dict) -> None:
    out = on.empty(n, name)
    pydist.reduce_scatter(out, [on.up(mine[j * n:(j + 1) * n], name) for j in range(size)])
    checks["reduce_scatter"] = out, total[rank * n:(rank + 1) * n]
    gathered = [on.empty(n, name) for _ in range(size)] if rank == 0 else None
    pydist.gather(on.up(mine[:n], name), gathered, dst=0)
    for r, part in enumerate(gathered or []):
        checks[f"gather[{r}]"] = part, values(n, r, name)
    piece = on.empty(n, name)
    pydist.scatter(piece, [on.up(values(n, j, name, 3), name) for j in range(size)] if rank == 0 else None, src=0)
    checks["scatter"] = piece, values(n, rank, name, 3)
    outs = [on.empty(n, name) for _ in range(size)]
    pydist.all_to_all(outs, [on.up(mine[j * n:(j + 1) * n], name) for j in range(size)])
    for r, part in enumerate(outs):
        checks[f"all_to_all[{r}]"] = part, values(n, r, name, start=rank * n)
    got = on.empty(n * size, name)
    right, left = (rank + 1) % size, (rank - 1) % size
    works = [pydist.irecv(got, src=left), pydist.isend(on.up(mine, name), dst=right)]
    for work in works:
        work.wait()
    checks["isend/irecv"] = got, values(n * size, left, name)


def every_collective(kind: str = "cuda") -> Row:
    found = []
    for size in (2, 4):
        found += [w for ranked in run_ranks(size, wrong_collectives, kind, BIG[kind], limit=300) for w in ranked]
    sizes = ", ".join(f"{s} B" for s in BIG[kind])
    detail = f"{len(NAMES)} dtypes x sizes {sizes} x 2 and 4 ranks on one device"
    return ("PASS", detail) if not found else ("FAIL", f"{len(found)} wrong: " + "; ".join(found[:6]))
