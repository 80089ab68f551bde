"""DDP step time: torch's DistributedDataParallel over pydist's plugin and over gloo, in one job.

    python -m pydist.bench.ddp --netns 2x2 [--link 1gbit]    # 2 hosts x 2 ranks on this machine (root)
    pydist-run --nproc-per-node 2 -m pydist.bench.ddp         # in any launched job (torchrun too)

Every rank builds the same MLP (``--hidden`` 4096: 25.2M parameters, 101 MB of float32
gradients), wraps it in torch's DDP (``--bucket-mb``, default torch's 25 MB buckets) over each backend in turn (the
same seed, so the same weights and batches), runs ``--warmup`` then ``--steps`` SGD steps
on random batches of ``--batch`` samples per rank and destroys the group. A step's time is
the slowest rank's (all_reduce MAX over the backend's own group); rank 0 prints the median
and best per backend, the ratio to gloo, and the largest difference between the two
backends' losses (rank 0's loss at every step: equal up to the summation order).
"""
from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta

from . import netns_job

BACKENDS = ("gloo", "pydist")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pydist.bench.ddp", description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per backend")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--batch", type=int, default=4, help="samples per rank per step")
    parser.add_argument("--hidden", type=int, default=4096, help="hidden width (4096: 25.2M parameters)")
    parser.add_argument("--bucket-mb", type=float, default=25.0,
                        help="DDP's bucket_cap_mb (25, torch's default; small: many small all_reduces)")
    parser.add_argument("--netns", type=netns_job.parse_shape, metavar="HOSTSxRANKS",
                        help="run as a multi-node job on this machine (network namespaces, root)")
    parser.add_argument("--link", metavar="RATE", help="with --netns: shape every host's link (tc units: 1gbit)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds the --netns job may take")
    return parser


def make_model(hidden: int):
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(hidden // 2, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def run_backend(backend: str, args: argparse.Namespace) -> tuple[list[float], list[float], int]:
    """Train on ``backend``: (slowest rank's time per timed step, rank 0's loss per step,
    parameter count)."""
    import torch
    import torch.distributed as tdist
    from torch.nn.parallel import DistributedDataParallel
    if backend == "pydist":
        import pydist.torch  # noqa: F401 - registers the backend
    tdist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    try:
        rank = tdist.get_rank()
        model = DistributedDataParallel(make_model(args.hidden), bucket_cap_mb=args.bucket_mb)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        batches = torch.Generator().manual_seed(1000 + rank)
        times, losses = [], []
        for step in range(args.warmup + args.steps):
            x = torch.randn(args.batch, args.hidden // 2, generator=batches)
            y = torch.randint(0, 10, (args.batch,), generator=batches)
            start = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step >= args.warmup:
                times.append(time.perf_counter() - start)
            losses.append(loss.item())
        slowest = torch.tensor(times, dtype=torch.float64)
        tdist.all_reduce(slowest, op=tdist.ReduceOp.MAX)
        return slowest.tolist(), losses, sum(p.numel() for p in model.parameters())
    finally:
        tdist.destroy_process_group()


def report(results: dict[str, tuple[list[float], list[float], int]], args: argparse.Namespace, world: int) -> str:
    times = {name: sorted(result[0]) for name, result in results.items()}
    params = results["pydist"][2]
    lines = [f"# DDP step (torch DistributedDataParallel), {world} ranks, {params / 1e6:.1f}M parameters "
             f"({params * 4 / 1e6:.0f} MB of gradients, {args.bucket_mb:g} MB buckets), batch {args.batch} per rank, "
             f"{args.steps} steps after {args.warmup}; slowest rank per step",
             f"# {'backend':8s} {'median ms':>10s} {'best ms':>9s} {'gloo/this':>10s}"]
    for name in BACKENDS:
        median = times[name][len(times[name]) // 2]
        ratio = times["gloo"][len(times["gloo"]) // 2] / median
        lines.append(f"  {name:8s} {median * 1e3:10.1f} {times[name][0] * 1e3:9.1f} {ratio:10.2f}")
    gloo_losses, pydist_losses = results["gloo"][1], results["pydist"][1]
    diff = max(abs(a - b) for a, b in zip(gloo_losses, pydist_losses))
    lines.append(f"# losses (rank 0): gloo {gloo_losses[0]:.6f} -> {gloo_losses[-1]:.6f}, pydist "
                 f"{pydist_losses[0]:.6f} -> {pydist_losses[-1]:.6f}; largest difference {diff:.2e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.link and not args.netns:
        parser.error("--link shapes the links of a --netns job: give --netns too")
    if args.netns:
        return netns_job.run(args.netns, args.link, netns_job.forwarded(argv), args.timeout, module="pydist.bench.ddp")
    import torch
    torch.set_num_threads(1)
    results = {name: run_backend(name, args) for name in BACKENDS}
    from .injob import place
    job = place()
    if job is None or job.rank == 0:
        print(report(results, args, job.world_size if job else 1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
