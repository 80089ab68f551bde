"""Time per call of torch.distributed operations on device tensors: pydist's group beside gloo
("cpu:pydist,cuda:gloo") against torch's gloo alone, the same processes and sizes, side by side.

Run (a GPU machine, from the source tree, no venv):
    PYTHONPATH=src python3 tools/gpu_bench.py [--device cuda] [--nproc 2] [--sizes 4,1K,1M,16M]
Every rank uses device 0 (one GPU is enough). --device cpu runs the same on CPU tensors
(to check the script where there is no GPU). Each row: the slowest rank's median time per
call over --iters calls after 3 warm-up calls; send/recv (ranks 0 and 1, CUDA tensors staged
by pydist) has no gloo column: gloo's CUDA send aborts the process.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from datetime import timedelta

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
sys.path.insert(0, SRC)  # run from the source tree (the ranks, spawned, import this module again)
from pydist.testing import free_port, stop_processes  # noqa: E402

BACKENDS = {"pydist+gloo": "cpu:pydist,cuda:gloo", "gloo": "gloo"}
OPS = ("all_reduce", "broadcast", "send/recv")


def parse_size(text: str) -> int:
    """'4', '1K', '16M' -> bytes."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
    return int(text[:-1] if scale > 1 else text) * scale


def _timed(op: str, tensor, rank: int, iters: int, sync) -> float:
    """Median seconds per call of ``op`` on ``tensor`` (3 warm-up calls first)."""
    import torch.distributed as dist
    times = []
    for i in range(iters + 3):
        dist.barrier()
        sync()
        start = time.perf_counter()
        if op == "all_reduce":
            dist.all_reduce(tensor)
        elif op == "broadcast":
            dist.broadcast(tensor, src=0)
        elif rank == 0:
            dist.send(tensor, dst=1)
        elif rank == 1:
            dist.recv(tensor, src=0)
        sync()
        if i >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _rank(rank: int, size: int, port: int, backend: str, device: str, sizes: list[int], iters: int, out) -> None:
    import torch
    import torch.distributed as dist

    import pydist.torch  # noqa: F401  registers "pydist"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size,
                            timeout=timedelta(seconds=120))
    on = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = {}
    for op in OPS:
        if op == "send/recv" and backend == "gloo" and device == "cuda":
            continue
        for nbytes in sizes:
            tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=on)
            seconds = torch.tensor([_timed(op, tensor, rank, iters, sync)])
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # a CPU tensor: the slowest rank's
            rows[(op, nbytes)] = seconds.item()
    dist.destroy_process_group()
    if rank == 0:
        out.put(rows)


def measure(backend: str, device: str, nproc: int, sizes: list[int], iters: int) -> dict:
    """{(op, bytes): seconds} for one backend string, ``nproc`` fresh processes."""
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    port = free_port()
    procs = [context.Process(target=_rank, args=(r, nproc, port, backend, device, sizes, iters, out))
             for r in range(nproc)]
    for proc in procs:
        proc.start()
    try:
        return out.get(timeout=600)
    finally:
        stop_processes(procs, 30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--sizes", default="4,1K,64K,1M,16M,64M")
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("gpu_bench: no CUDA GPU here (torch.cuda.is_available() is False); --device cpu runs it on CPU")
            return 2
    results = {label: measure(backend, args.device, args.nproc, sizes, args.iters)
               for label, backend in BACKENDS.items()}
    print(f"# {args.nproc} ranks, {args.device} tensors, slowest rank's median of {args.iters} calls, us")
    print(f"# {'op':<11} {'bytes':>10} {'pydist+gloo':>12} {'gloo':>10} {'ratio':>6}")
    for op in OPS:
        for nbytes in sizes:
            mine, theirs = (results[label].get((op, nbytes)) for label in BACKENDS)
            if mine is None:
                continue
            gloo = f"{theirs * 1e6:10.1f}" if theirs is not None else f"{'aborts':>10}"
            ratio = f"{theirs / mine:6.2f}" if theirs else f"{'-':>6}"
            print(f"  {op:<11} {nbytes:>10} {mine * 1e6:12.1f} {gloo} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
