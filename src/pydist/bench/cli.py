"""``pydist-bench``: nccl-tests-style collective benchmarks of pydist, optionally against gloo and MPI.

::

    pydist-bench [--op all_reduce|all_gather|reduce_scatter|broadcast|all_to_all|sendrecv]
                 [--nproc 2] [--sizes 4:64M] [--dtype float32] [--iters 20] [--warmup 5]
                 [--budget 1G] [--backend pydist|mpi] [--compare gloo,mpi] [--timeout 1800]
                 [--json] [--plot out.png]

Prints one row per size: bytes, element count, time in µs (median over timed iterations
of the slowest rank's time), algbw and busbw in GB/s, then per ``--compare`` backend its
time, busbw and the ratio (its time / main time: above 1 means the main backend is faster).
Exit status: 0 on success, 1 if the main backend cannot run or fails, 2 on a usage error,
130 when interrupted.
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
from collections.abc import Sequence
from contextlib import closing

from . import plot
from .backends import BACKENDS, COMPARE_CHOICES, MAIN_CHOICES
from .launch import BackendFailed, run_backend
from .ops import DTYPES, OPS, iterations, size_plan
from .progress import Progress
from .report import BackendResult, Meta, format_table, to_json
from .sizes import format_size, parse_size, parse_sizes


def _arg(parse):
    """Wrap a parser so its ValueError becomes argparse's usage error."""
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
    convert.__name__ = parse.__name__
    return convert


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return int(text)


def _non_negative(text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"expected a non-negative integer, got {text!r}")
    return int(text)


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"expected a positive number of seconds, got {text!r}")
    return value


def _budget(text: str) -> int:
    return 0 if text.strip() == "0" else parse_size(text)


def _compare(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in COMPARE_CHOICES]
    if unknown:
        raise ValueError(f"unknown backend {unknown[0]!r}; choose from {', '.join(COMPARE_CHOICES)}")
    return list(dict.fromkeys(names))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pydist-bench", description="nccl-tests-style collective benchmarks of pydist, "
                                     "optionally side by side with gloo and MPI.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--op", choices=list(OPS), default="all_reduce", help="operation to time")
    parser.add_argument("--nproc", type=_arg(_positive), default=2, help="ranks (processes) per backend")
    parser.add_argument("--sizes", type=_arg(parse_sizes), default="4:64M",
                        help="bytes per rank buffer: sizes with K/M/G suffixes, a:b[:factor] ranges, comma lists")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--iters", type=_arg(_positive), default=20, help="timed iterations per size")
    parser.add_argument("--warmup", type=_arg(_non_negative), default=5, help="untimed iterations per size")
    parser.add_argument("--budget", type=_arg(_budget), default="1G",
                        help="fewer iterations for large sizes: at most BUDGET/size timed (but >= 3); 0: no cap")
    parser.add_argument("--backend", choices=list(MAIN_CHOICES), default="pydist",
                        help="what the main columns measure (mpi: pydist's own MPI backend under mpiexec)")
    parser.add_argument("--compare", type=_arg(_compare), default=[],
                        help="comma list of backends to run too: gloo (torch), mpi (mpi4py + mpiexec), pydist")
    parser.add_argument("--timeout", type=_arg(_seconds), default=1800.0, help="seconds allowed for each backend's run")
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--plot", metavar="PATH", help="write busbw and time against size (needs matplotlib)")
    return parser


def _run_one(result: BackendResult, position: str, args: argparse.Namespace, config: dict,
             progress: Progress) -> None:
    """Run one backend into ``result``; BackendFailed propagates with the rows so far kept."""
    total = len(config["plan"])
    # closing(): the workers are stopped at once even if this loop is interrupted
    with closing(run_backend(BACKENDS[result.key], args.nproc, config, args.timeout)) as events:
        for event in events:
            if event["event"] == "start":
                progress.update(f"{args.op} {result.label} {position} backends, size "
                                f"{format_size(event['bytes'])} ({event['index'] + 1}/{total})")
            elif event["event"] == "row":
                result.rows[event["bytes"]] = {key: event[key] for key in ("seconds", "iters", "warmup")}


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _measure_all(results: list[BackendResult], args: argparse.Namespace, config: dict, progress: Progress) -> int:
    """Run every available backend in turn; 0, or 1 if the main one failed (its error printed).
    SIGTERM is treated like Ctrl-C meanwhile, so the workers are stopped on the way out."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    try:
        for index, result in enumerate(results):
            if result.status != "ok":
                continue
            try:
                _run_one(result, f"{index + 1}/{len(results)}", args, config, progress)
            except BackendFailed as error:
                result.status, result.note = "failed", str(error)
                if index == 0:
                    progress.clear()
                    print(f"pydist-bench: error: {result.label} failed: {error}", file=sys.stderr)
                    return 1
        return 0
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.nproc < OPS[args.op].min_ranks:
        parser.error(f"--op {args.op} needs --nproc >= {OPS[args.op].min_ranks}")
    keys = [MAIN_CHOICES[args.backend]] + [COMPARE_CHOICES[name] for name in args.compare]
    keys = list(dict.fromkeys(keys))
    if args.plot:
        try:
            plot.require()
        except plot.PlotUnavailable as error:
            parser.error(str(error))
    results = [BackendResult(key, BACKENDS[key].label) for key in keys]
    for result in results:
        reason = BACKENDS[result.key].unavailable()
        if reason:
            result.status, result.note = "unavailable", reason
    if results[0].status != "ok":
        print(f"pydist-bench: error: --backend {args.backend}: {results[0].note}", file=sys.stderr)
        return 1
    plan = size_plan(args.op, args.sizes, args.dtype, args.nproc)
    config = {"op": args.op, "dtype": args.dtype, "timeout": args.timeout,
              "plan": [[nbytes, count, *iterations(nbytes, args.iters, args.warmup, args.budget)]
                       for nbytes, count in plan]}
    meta = Meta(shlex.join(["pydist-bench", *argv]), args.op, args.nproc, args.dtype, args.iters, args.warmup,
                args.budget, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                os.getloadavg()[0])
    progress = Progress()
    try:
        if _measure_all(results, args, config, progress):
            return 1
    except KeyboardInterrupt:
        progress.clear()
        print("pydist-bench: interrupted", file=sys.stderr)
        return 130
    progress.clear()
    print(to_json(meta, plan, results) if args.json else format_table(meta, plan, results))
    if args.plot:
        plot.write_plot(args.plot, meta, plan, results)
    return 0
