"""What one pydist-bench invocation measures and prints, whoever starts its ranks.

Shared by :mod:`.cli` (which starts each backend's workers itself) and :mod:`.injob`
(every process of an already launched job is one rank): the backends to run, the size
plan and the workers' config, the :class:`.report.Meta` header, turning rank 0's
``start``/``row`` events into progress lines and table rows, and the final output.
"""
from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Callable

from . import devices, plot
from .backends import BACKENDS, COMPARE_CHOICES, MAIN_CHOICES
from .ops import iterations, size_plan
from .report import BackendResult, Job, Meta, format_table, to_json
from .sizes import format_size
from .status_line import StatusLine


def backend_results(args: argparse.Namespace) -> list[BackendResult]:
    """One result per backend to run, main first, without repeats; ``unavailable`` where
    this process cannot run it (see :meth:`.backends.BackendSpec.unavailable`)."""
    keys = [MAIN_CHOICES[args.backend]] + [COMPARE_CHOICES[name] for name in args.compare]
    results = [BackendResult(key, BACKENDS[key].label) for key in dict.fromkeys(keys)]
    for result in results:
        reason = BACKENDS[result.key].unavailable() or devices.unavailable(result.key, args.device)
        if reason:
            result.status, result.note = "unavailable", reason
    return results


def plan_and_config(args: argparse.Namespace) -> tuple[list[tuple[int, int]], dict]:
    """The (bytes, count) plan for ``args.nproc`` ranks and the config every rank runs."""
    plan = size_plan(args.op, args.sizes, args.dtype, args.nproc)
    config = {"op": args.op, "dtype": args.dtype, "timeout": args.timeout, "transport": args.transport,
              "device": args.device,
              "plan": [[nbytes, count, *iterations(nbytes, args.iters, args.warmup, args.budget)]
                       for nbytes, count in plan]}
    return plan, config


def make_meta(argv: list[str], args: argparse.Namespace, job: Job | None = None) -> Meta:
    """The header of this run, with this host's CPU count and load; its command is the one
    the user typed (``--shown-command``, for the ranks of a --netns job), else ``argv``'s."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    command = getattr(args, "shown_command", None) or shlex.join(["pydist-bench", *argv])
    return Meta(command, args.op, args.nproc, args.dtype, args.iters, args.warmup,
                args.budget, cpus or 1, os.getloadavg()[0], job)


def recorder(result: BackendResult, position: str, op: str, total: int,
             progress: StatusLine) -> Callable[[dict], None]:
    """A handler of rank 0's events: ``start`` updates the progress line, ``row`` is kept in ``result``."""
    def record(event: dict) -> None:
        if event["event"] == "start":
            progress.update(f"{op} {result.label} {position} backends, size "
                            f"{format_size(event['bytes'])} ({event['index'] + 1}/{total})")
        elif event["event"] == "row":
            result.rows[event["bytes"]] = {key: event[key] for key in ("seconds", "iters", "warmup")}
    return record


def require_plot(parser: argparse.ArgumentParser) -> None:
    """A usage error (exit 2) unless ``--plot`` can work (matplotlib importable)."""
    try:
        plot.require()
    except plot.PlotUnavailable as error:
        parser.error(str(error))


def write_output(args: argparse.Namespace, meta: Meta, plan: list[tuple[int, int]],
                 results: list[BackendResult]) -> None:
    """Print the table (or ``--json``) to stdout; write ``--plot`` if asked."""
    print(to_json(meta, plan, results) if args.json else format_table(meta, plan, results), flush=True)
    if args.plot:
        plot.write_plot(args.plot, meta, plan, results)
