"""pydist-bench inside an already launched job: every process is one rank, none is started.

When RANK and WORLD_SIZE (or mpiexec's PMI_RANK/PMI_SIZE, OMPI_COMM_WORLD_RANK/SIZE) are
set, pydist-bench was started by pydist-run, torchrun or mpiexec, on one host or many, like
nccl-tests under mpirun::

    pydist-run --nproc-per-node 2 -m pydist.bench --sizes 4K:64M --compare gloo
    pydist-run --nnodes 4 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint H:P \\
        -m pydist.bench --op all_reduce --sizes 16M:64M             # on every host
    torchrun --nproc-per-node 2 -m pydist.bench --backend gloo
    mpiexec -n 2 pydist-bench --compare gloo,mpi       # several hosts: also MASTER_ADDR

Each rank runs the backends one after the other, the main one (``--backend``) then every
``--compare`` one: it joins that backend's group through env:// (the launcher's variables),
runs the normal workers' timing loop (:func:`.timing.run_plan`) and destroys the group.
Rank 0 prints the normal table (or ``--json``), whose first line also names the backends,
the ranks, the hosts (distinct host identities: network namespaces count) and the
launcher; the other ranks print nothing but errors, each naming its rank.

- ``--nproc`` is the job's world size; giving another value is a usage error (exit 2).
- A ``--compare`` backend that some rank cannot run (torch missing on one host) is skipped
  by every rank, with a note naming those ranks: the ranks agree on it over the main
  backend's group, so no rank waits in a group the others never join. ``mpi`` (mpi4py) and
  ``--backend mpi`` need a job started by mpiexec.
- ``--timeout``: seconds each backend may take on each rank, from joining its group to
  leaving it; a rank past it prints an error and exits 1 (the others then fail too).
- Exit status: 0; 1 if the main backend cannot run or fails on this rank (a failed
  ``--compare`` backend is a note in rank 0's table and an error on the failing rank's
  stderr); 2 on a usage error; 130 when interrupted.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.settings import settings
from ..transport.identity import host_identity
from .backends import BACKENDS
from .ops import OPS
from .report import BackendResult, Job
from .session import backend_results, make_meta, plan_and_config, recorder, require_plot, write_output
from .status_line import StatusLine
from .timing import run_plan

RANK_VARIABLES = (("RANK", "WORLD_SIZE"), ("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"))
"""(rank, world size) variable pairs: either set means a launcher started this process."""
MPI_LAUNCHERS = ("openmpi", "mpich")


@dataclass(frozen=True)
class Place:
    """This process's rank in the launched job, and the job's size."""

    rank: int
    world_size: int


def place(environ: dict[str, str] | None = None) -> Place | None:
    """This process's place from the first pair of :data:`RANK_VARIABLES` set to integers;
    None outside a launched job."""
    env = os.environ if environ is None else environ
    for rank, size in RANK_VARIABLES:
        if env.get(rank, "").isdigit() and env.get(size, "").isdigit():
            return Place(int(env[rank]), int(env[size]))
    return None


def _error(rank: int, message: str) -> None:
    print(f"pydist-bench: error: rank {rank}: {message}", file=sys.stderr, flush=True)


def launcher_title(launcher: str) -> str:
    """Who started the job, for the table: pydist-run or torchrun, an MPI launcher, or plain variables."""
    from pydist.rendezvous import TORCHRUN_MARKERS
    from pydist.rendezvous.launch_env import LAUNCHERS
    if launcher == "torchrun":
        return "torchrun" if any(os.environ.get(name) for name in TORCHRUN_MARKERS) else "pydist-run"
    titles = {spec.name: spec.title for spec in LAUNCHERS}
    return titles.get(launcher, "RANK/WORLD_SIZE variables")


def count_hosts(comm: Any) -> int:
    """Distinct hosts among the ranks, as pydist tells them apart (host name, boot and network
    namespace, or PYDIST_HOST_ID): each rank writes a 48-bit hash of its host identity (+1)
    into its slot of a zero vector, so the maximum across ranks holds every rank's."""
    slots = np.zeros(comm.size)
    slots[comm.rank] = int.from_bytes(hashlib.sha256(host_identity(settings()).encode()).digest()[:6], "big") + 1
    return len(set(comm.max_across_ranks(slots).tolist()))


def agree_on_availability(comm: Any, others: list[BackendResult]) -> None:
    """Mark unavailable, on every rank alike, each backend in ``others`` that some rank cannot
    run. Rank 0's note gives its own reason, or names the ranks that lack it; those ranks
    then print their reason."""
    if not others:
        return
    missing = np.zeros((len(others), comm.size))
    missing[:, comm.rank] = [result.status != "ok" for result in others]
    missing = comm.max_across_ranks(missing.ravel()).reshape(missing.shape)
    for result, row in zip(others, missing):
        ranks = np.flatnonzero(row).tolist()
        if not ranks:
            continue
        if ranks[0] != 0:  # rank 0 could run it: say where it is missing, and there why
            if result.status != "ok":
                _error(comm.rank, f"--compare {result.label}: {result.status}: {result.note}")
            plural = "s" if len(ranks) > 1 else ""
            result.note = f"on rank{plural} {', '.join(map(str, ranks))} (their stderr says why)"
        result.status = "unavailable"


@contextmanager
def deadline(seconds: float, rank: int, label: str) -> Iterator[None]:
    """Exit the process (status 1, error printed) unless the body ends within ``seconds``."""
    finished = threading.Event()

    def expire() -> None:
        if not finished.wait(seconds):
            _error(rank, f"{label} timed out after {seconds:g} s")
            os._exit(1)

    watchdog = threading.Thread(target=expire, name="bench-deadline", daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        finished.set()
        watchdog.join()


def run_backend(result: BackendResult, position: str, args: argparse.Namespace, config: dict,
                progress: StatusLine, rank: int, on_join: Callable[[Any], None] = lambda comm: None) -> None:
    """Join ``result``'s group, call ``on_join(comm)``, run the plan (rank 0 records the rows
    into ``result``) and destroy the group, within ``--timeout``."""
    with deadline(args.timeout, rank, result.label):
        comm = BACKENDS[result.key].connect(args.timeout)
        on_join(comm)
        run_plan(comm, config, recorder(result, position, args.op, len(config["plan"]), progress)
                 if comm.rank == 0 else None)
        comm.close()


def _mark_mpi_backends(results: list[BackendResult], launcher: str) -> None:
    """Backends run under mpiexec cannot run in a job another launcher started."""
    for result in results:
        if result.status == "ok" and BACKENDS[result.key].launcher == "mpiexec" and launcher not in MPI_LAUNCHERS:
            result.status = "unavailable"
            result.note = f"needs a job started by mpiexec, not {launcher_title(launcher)}"


def main(args: argparse.Namespace, argv: list[str], parser: argparse.ArgumentParser, job: Place) -> int:
    """Run this rank's part (see the module note); the exit status."""
    from pydist.rendezvous import launch_info
    if getattr(args, "nproc", job.world_size) != job.world_size:
        parser.error(f"--nproc {args.nproc} contradicts the launched job's world size ({job.world_size}); "
                     "inside a launched job leave --nproc out")
    args.nproc = job.world_size
    if args.transport == "tcp":
        parser.error("--transport tcp starts its own workers; in a launched job set the environment at "
                     "launch instead (PYDIST_SHM=0 for pydist)")
    if args.nproc < OPS[args.op].min_ranks:
        parser.error(f"--op {args.op} needs at least {OPS[args.op].min_ranks} ranks; the job has {args.nproc}")
    if args.plot and job.rank == 0:
        require_plot(parser)
    try:
        launcher = launch_info().launcher
    except ValueError as error:
        _error(job.rank, str(error))
        return 1
    results = backend_results(args)
    _mark_mpi_backends(results, launcher)
    if results[0].status != "ok":
        _error(job.rank, f"--backend {args.backend}: {results[0].note}")
        return 1
    plan, config = plan_and_config(args)
    meta, progress = make_meta(argv, args), StatusLine()
    hosts: list[int] = []

    def on_main_join(comm: Any) -> None:
        hosts.append(count_hosts(comm))
        agree_on_availability(comm, results[1:])

    try:
        for index, result in enumerate(results):
            if result.status != "ok":
                continue
            try:
                run_backend(result, f"{index + 1}/{len(results)}", args, config, progress, job.rank,
                            on_main_join if index == 0 else (lambda comm: None))
            except Exception as error:  # noqa: BLE001 - reported with this rank's number
                progress.clear()
                _error(job.rank, f"{result.label} failed: {type(error).__name__}: {error}")
                if index == 0:
                    return 1
                result.status, result.note = "failed", f"rank {job.rank}: {type(error).__name__}: {error}"
    except KeyboardInterrupt:
        progress.clear()
        _error(job.rank, "interrupted")
        return 130
    progress.clear()
    if job.rank == 0:
        meta.job = Job(launcher_title(launcher), hosts[0], [result.label for result in results])
        write_output(args, meta, plan, results)
    return 0
