"""``pydist-bench``: nccl-tests-style collective benchmarks of pydist, optionally against gloo and MPI.

::

    pydist-bench [--op all_reduce|all_gather|reduce_scatter|broadcast|all_to_all|sendrecv|barrier]
                 [--nproc 2] [--sizes 4:64M] [--dtype float32] [--device cpu|cuda|standin]
                 [--iters 20] [--warmup 5]
                 [--budget 1G] [--backend pydist|gloo|mpi] [--compare gloo,mpi,pydist,pydist-tls,pydist-1nic]
                 [--transport auto|tcp] [--timeout 1800] [--json] [--plot out.png]
                 [--netns HOSTSxRANKS [--link RATE] [--nics N]]
    pydist-bench --scale N[,N...] [--scale-shm] [--iters 20] [--timeout 1800] [--json]

Prints one row per size: bytes, element count, time in µs (median over timed iterations
of the slowest rank's time), algbw and busbw in GB/s, then per ``--compare`` backend its
time, busbw and the ratio (its time / main time: above 1 means the main backend is faster).
Exit status: 0 on success, 1 if the main backend cannot run or fails, 2 on a usage error,
130 when interrupted.

Started inside an already launched job (RANK/WORLD_SIZE, PMI_RANK/PMI_SIZE or
OMPI_COMM_WORLD_RANK/SIZE set: pydist-run, torchrun, mpiexec), it starts no workers: every
process is one rank and rank 0 prints the table (see :mod:`.injob`). ``--netns 2x2`` runs
it as a job of 2 hosts x 2 ranks in network namespaces on this machine (see :mod:`.netns_job`).
``--scale 8,16`` starts 8, then 16 ranks and reports what their init costs (see :mod:`.scale`).
"""
from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager

from . import comms, devices, injob, netns_job, scale
from .backends import BACKENDS, COMPARE_CHOICES, MAIN_CHOICES
from .launch import BackendFailed, run_backend
from .ops import DTYPES, OPS
from .report import BackendResult
from .session import backend_results, make_meta, plan_and_config, recorder, require_plot, write_output
from .sizes import parse_size, parse_sizes
from .status_line import StatusLine

DEFAULT_NPROC = 2


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


def build_parser(prog: str = "pydist-bench") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="nccl-tests-style collective benchmarks of pydist, "
                                     "optionally side by side with gloo and MPI. Inside a job launched by "
                                     "pydist-run, torchrun or mpiexec it starts no workers: every process is "
                                     "one rank, and rank 0 prints the table.",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--op", choices=list(OPS), default="all_reduce", help="operation to time")
    parser.add_argument("--nproc", type=_arg(_positive), default=argparse.SUPPRESS,
                        help=f"ranks (processes) per backend (default: {DEFAULT_NPROC}; inside a launched job: "
                        "its WORLD_SIZE, and a different --nproc is an error)")
    parser.add_argument("--sizes", type=_arg(parse_sizes), default="4:64M",
                        help="bytes per rank buffer: sizes with K/M/G suffixes, a:b[:factor] ranges, comma lists")
    parser.add_argument("--dtype", choices=DTYPES, default="float32")
    parser.add_argument("--device", choices=devices.DEVICES, default="cpu",
                        help="where the buffers are: cuda (pydist's device engine; compare gloo and nccl), or "
                        "standin (pydist's CPU stand-in of a GPU: the device path without one, not its speed)")
    parser.add_argument("--iters", type=_arg(_positive), default=20, help="timed iterations per size")
    parser.add_argument("--warmup", type=_arg(_non_negative), default=5, help="untimed iterations per size")
    parser.add_argument("--budget", type=_arg(_budget), default="1G",
                        help="fewer iterations for large sizes: at most BUDGET/size timed (but >= 3); 0: no cap")
    parser.add_argument("--backend", choices=list(MAIN_CHOICES), default="pydist",
                        help="what the main columns measure (gloo: torch's; mpi: pydist's own MPI backend under "
                        "mpiexec)")
    parser.add_argument("--compare", type=_arg(_compare), default=[],
                        help="comma list of backends to run too: gloo (torch), mpi (mpi4py + mpiexec), pydist")
    parser.add_argument("--transport", choices=["auto", "tcp"], default="auto",
                        help="tcp: every byte over TCP sockets, as between hosts (pydist: PYDIST_SHM=0; mpi: "
                        "MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self; gloo: always tcp); auto: each backend's default")
    parser.add_argument("--timeout", type=_arg(_seconds), default=1800.0, help="seconds allowed for each backend's run")
    parser.add_argument("--shown-command", default=None, help=argparse.SUPPRESS)  # --netns: the user's command
    parser.add_argument("--json", action="store_true", help="print JSON instead of the table")
    parser.add_argument("--plot", metavar="PATH", help="write busbw and time against size (needs matplotlib)")
    parser.add_argument("--netns", type=_arg(netns_job.parse_shape), metavar="HOSTSxRANKS",
                        help="run as a multi-node job on this machine: HOSTS network namespaces joined by veth "
                        "links, RANKS ranks each under pydist-run (root, iproute2)")
    parser.add_argument("--link", metavar="RATE", help="with --netns: shape every host's link (tc units: 1gbit)")
    parser.add_argument("--nics", type=_arg(_positive), default=1,
                        help="with --netns: interfaces per host, each on its own network; pydist stripes over all")
    parser.add_argument("--scale", type=_arg(scale.parse_scale), metavar="N[,N...]",
                        help="start N ranks on this host (for each N given) and report what init costs (import, "
                        "store/rendezvous, connections), memory, descriptors, the store's requests and a small "
                        "all_reduce (--iters calls); see docs/scale.md")
    parser.add_argument("--scale-shm", action="store_true",
                        help="with --scale: let the ranks use shared memory (default: PYDIST_SHM=0, as if each "
                        "rank were a host)")
    return parser


def _scale(args: argparse.Namespace, argv: list[str], parser: argparse.ArgumentParser) -> int:
    """``--scale``: refuse the options it does not take, then run it (see :mod:`.scale`)."""
    others = [flag for flag, given in (("--netns", args.netns), ("--compare", args.compare),
                                       ("--plot", args.plot), ("--nproc", hasattr(args, "nproc"))) if given]
    if others:
        parser.error(f"--scale starts its own ranks and times only all_reduce: not with {', '.join(others)}")
    try:
        with _signals_interrupt():
            return scale.main(args, argv)
    except KeyboardInterrupt:
        print("pydist-bench: interrupted", file=sys.stderr)
        return 130


def _run_one(result: BackendResult, position: str, args: argparse.Namespace, config: dict,
             progress: StatusLine) -> None:
    """Run one backend into ``result``; BackendFailed propagates with the rows so far kept."""
    record = recorder(result, position, args.op, len(config["plan"]), progress)
    # closing(): the workers are stopped at once even if this loop is interrupted
    with closing(run_backend(BACKENDS[result.key], args.nproc, config, args.timeout)) as events:
        for event in events:
            record(event)


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGINT raise KeyboardInterrupt meanwhile (SIGINT too, as pydist-run and torchrun
    do: a shell starts background jobs with it ignored), so the workers are stopped on the way out."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {signum: signal.signal(signum, _interrupt) for signum in _STOP_SIGNALS} if main_thread else {}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _measure_all(results: list[BackendResult], args: argparse.Namespace, config: dict, progress: StatusLine) -> int:
    """Run every available backend in turn; 0, or 1 if the main one failed (its error printed)."""
    with _signals_interrupt():
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


def _in_job_tls(compare: list[str], scratch: str) -> dict[str, str]:
    """For a launched job comparing pydist-tls: its certificates as BENCH_TLS_* (PYDIST_TLS_*
    would put the launcher's store, and so every column, on TLS; see comms.connect_pydist_tls)."""
    spec = BACKENDS["pydist-tls"]
    if spec.key not in compare or spec.extra_env is None:
        return {}
    from ..net.tls import VARIABLES
    made = spec.extra_env(scratch)
    return {bench: made[name] for name, bench in zip(VARIABLES, comms.BENCH_TLS)}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    job = injob.place()
    parser = build_parser(f"pydist-bench (rank {job.rank})" if job else "pydist-bench")
    args = parser.parse_args(argv)
    if job:
        if args.netns or args.scale:
            parser.error(f"{'--netns' if args.netns else '--scale'} starts a job of its own: not inside a launched job")
        return injob.main(args, argv, parser, job)
    if args.scale:
        return _scale(args, argv, parser)
    if args.scale_shm:
        parser.error("--scale-shm goes with --scale")
    if "nccl" in args.compare and args.device != "cuda":
        parser.error("--compare nccl: NCCL runs CUDA buffers only; add --device cuda")
    if args.link and not args.netns:
        parser.error("--link shapes the links of a --netns job: give --netns too")
    if args.nics != 1 and not args.netns:
        parser.error("--nics gives the hosts of a --netns job interfaces: give --netns too")
    if args.netns:
        if hasattr(args, "nproc"):
            parser.error(f"--nproc contradicts --netns {args.netns} (the job has hosts x ranks ranks)")
        if args.transport != "auto":
            parser.error("--transport tcp with --netns: the hosts are separate already (use --netns Hx1)")
        with tempfile.TemporaryDirectory(prefix="pydist-bench-") as scratch:
            return netns_job.run(args.netns, args.link, netns_job.job_args(argv), args.timeout,
                                 extra_env=_in_job_tls(args.compare, scratch), nics=args.nics)
    args.nproc = getattr(args, "nproc", DEFAULT_NPROC)
    if args.nproc < OPS[args.op].min_ranks:
        parser.error(f"--op {args.op} needs --nproc >= {OPS[args.op].min_ranks}")
    if args.plot:
        require_plot(parser)
    results = backend_results(args)
    if results[0].status != "ok":
        print(f"pydist-bench: error: --backend {args.backend}: {results[0].note}", file=sys.stderr)
        return 1
    plan, config = plan_and_config(args)
    meta = make_meta(argv, args)
    progress = StatusLine()
    try:
        if _measure_all(results, args, config, progress):
            return 1
    except KeyboardInterrupt:
        progress.clear()
        print("pydist-bench: interrupted", file=sys.stderr)
        return 130
    progress.clear()
    write_output(args, meta, plan, results)
    return 0
