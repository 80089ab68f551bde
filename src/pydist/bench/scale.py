"""``pydist-bench --scale N[,N...]``: N ranks started on this host, what their init and a small all_reduce cost.

For each N in turn: check that this process may open enough descriptors (:mod:`.fd_limit`:
raised up to the hard limit, else an error naming both numbers), start N processes with
env:// variables (rank 0 serves the store; PYDIST_SHM=0 unless ``--scale-shm``, so every
byte goes over TCP as between N hosts), each running :mod:`.scale_worker`, and collect one
``rank`` event per rank and rank 0's ``store`` event; then print one table (or ``--json``)
for all N (:mod:`.scale_report`). The ranks share this host's cores, so at large N their
times include waiting for a core: the table's header says how many there are.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Iterator

from .fd_limit import LimitTooLow, ensure_fds
from .launch import BackendFailed, Command, Workers, rank_env, stream
from .scale_report import format_table, summarize, to_json
from .scale_worker import BOOTSTRAP
from .worker import LAUNCHER_ENV


def parse_scale(text: str) -> list[int]:
    """``"8"`` or ``"8,16,32"``: the world sizes to run, each at least 2, in the order given."""
    sizes = []
    for part in (p.strip() for p in text.split(",")):
        if not part.isdigit() or int(part) < 2:
            raise ValueError(f"expected world sizes of at least 2, comma-separated, got {text!r}")
        sizes.append(int(part))
    return list(dict.fromkeys(sizes))


def _commands(nproc: int, config: dict, shm: bool) -> Iterator[Command]:
    """Each rank's command, stamped with the time just before it is started."""
    from pydist.testing import free_port
    port = free_port()
    base = {"OMP_NUM_THREADS": "1", **os.environ, LAUNCHER_ENV: str(os.getpid()), "PYDIST_SHM": "1" if shm else "0"}
    for rank in range(nproc):
        argv = [sys.executable, "-c", BOOTSTRAP, repr(time.time()), json.dumps(config)]
        yield argv, {**base, **rank_env(rank, nproc, port)}


def run_ranks(nproc: int, iters: int, timeout: float, shm: bool) -> dict:
    """Start ``nproc`` ranks and collect their events: ``nproc``, ``ranks`` (rank -> its
    ``rank`` event), ``store`` (rank 0's). Raises BackendFailed (a rank failed, exited early,
    did not report, or ``timeout`` seconds passed)."""
    ranks: dict[int, dict] = {}
    store: dict | None = None
    for event in stream(Workers(_commands(nproc, {"timeout": timeout, "iters": iters}, shm)), timeout):
        if event["event"] == "rank":
            ranks[event["rank"]] = event
        elif event["event"] == "store":
            store = event
    if len(ranks) != nproc or store is None or store["init"] is None:
        raise BackendFailed(f"{nproc} ranks finished but reported {len(ranks)} results"
                            f"{'' if store and store['init'] else ' and no store counts'}")
    return {"nproc": nproc, "ranks": ranks, "store": store}


def _title(args: argparse.Namespace) -> str:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    transport = "tcp + shared memory" if args.scale_shm else "tcp only (PYDIST_SHM=0)"
    return (f"# pydist-bench --scale: N ranks on this host, {transport}, all_reduce float32 iters={args.iters}"
            f"   (host: {cpus} cpus, load {os.getloadavg()[0]:.2f})")


def main(args: argparse.Namespace, argv: list[str]) -> int:
    """Run every N of ``args.scale``; print the table (or JSON). 0, or 1 when a run fails."""
    command = shlex.join(["pydist-bench", *argv])
    title, summaries = _title(args), []
    for nproc in args.scale:
        try:
            ensure_fds(nproc)
            print(f"pydist-bench: starting {nproc} ranks", file=sys.stderr, flush=True)
            summaries.append(summarize(run_ranks(nproc, args.iters, args.timeout, args.scale_shm)))
        except (LimitTooLow, BackendFailed) as error:
            print(f"pydist-bench: error: --scale {nproc}: {error}", file=sys.stderr)
            return 1
    if args.json:
        print(to_json(summaries, {"command": command, "title": title, "shm": args.scale_shm, "iters": args.iters}))
    else:
        print(format_table(summaries, title, command), flush=True)
    return 0
