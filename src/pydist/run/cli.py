"""``pydist-run``: torchrun's command line.

::

    pydist-run [--nproc-per-node N|cpu|auto] [--nnodes N|MIN:MAX] [--node-rank R]
               [--master-addr A] [--master-port P] [--rdzv-backend static|c10d]
               [--rdzv-endpoint HOST[:PORT]] [--rdzv-id ID] [--rdzv-conf K=V,...]
               [--standalone] [--max-restarts N] [--monitor-interval S] [--role NAME]
               [--log-dir DIR] [-r SPEC] [-t SPEC] [--local-ranks-filter R,...]
               [--local-addr A] [--shutdown-timeout S] [--on-failure restart|continue|replace]
               [--max-replacements N]
               [--tls-cert F --tls-key F --tls-ca F]
               [-m | --no-python | --run-path] script [script args...]

Flags take dash or underscore spellings (``--nproc_per_node``) and, like torchrun, default
to ``$PET_<NAME>`` (``PET_NPROC_PER_NODE=4``) when set. Everything after the script is
passed to it untouched, even if it looks like a launcher flag; an unknown flag before the
script is an error (exit 2).

Rendezvous: ``static`` (the default) has node 0 host the store at
``--master-addr:--master-port`` and every node give ``--node-rank``; ``c10d`` has the
agent on the endpoint's host host it at ``--rdzv-endpoint`` (port 29400 by default) and
assigns node ranks, and allows ``--nnodes MIN:MAX``. ``--rdzv-conf`` takes
``join_timeout`` (600 s), ``last_call_timeout`` (30 s) and ``read_timeout`` (60 s: how long
to retry reaching the endpoint). Differences from torchrun: a single-node job's
``--master-port`` defaults to 0 (a free port, so jobs never collide; multi-node: 29500);
``--max-restarts`` counts restarts for the whole job; ``--shutdown-timeout`` (grace before
SIGKILL) defaults to 5 s, not 30. ``--on-failure continue`` (pydist's own): a worker that
fails is reported and the others run on (for jobs that recover with ``shrink_group``); the
node's launcher exits 0 when at least one of its workers exited 0. ``--on-failure replace``
(pydist's own): as ``continue``, and a replacement process starts in the failed worker's
slot (same LOCAL_RANK and RANK, PYDIST_JOIN=1), which joins the running job when the others
call ``pydist.admit_joiners()``; ``--max-replacements`` (10) bounds them for the whole job,
past which a failure is handled as with ``continue``. ``--tls-cert``,
``--tls-key``, ``--tls-ca`` (pydist's own) set PYDIST_TLS_CERT/KEY/CA for the launcher's store and
the workers: mutual TLS for the whole job.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import uuid
from collections.abc import Sequence
from typing import Any, NoReturn

from ..core.settings import settings
from .config import LaunchConfig, worker_command
from .logs import LogSpec, parse_ranks_filter, parse_streams


def _env_default(dest: str, default: Any) -> Any:
    """torchrun's ``PET_<DEST>`` environment override of a flag's default."""
    return os.environ.get(f"PET_{dest.upper()}", default)


def _flag_default(dest: str) -> bool:
    return bool(int(os.environ.get(f"PET_{dest.upper()}", "0")))


def _port(text: str) -> int:
    """A TCP port number (0: a free one), for argparse: a usage error otherwise."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535, got {text!r}")
    return port


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; flag names, spellings and meanings are torchrun's."""
    parser = argparse.ArgumentParser(prog="pydist-run", description="Launch a pydist job's workers on this node.",
                                     allow_abbrev=False)  # "script --nproc 2" must reach the script

    def add(*names: str, default: Any = None, **kwargs: Any) -> None:
        dest = names[-1].lstrip("-").replace("-", "_")
        spellings = [*names, *("--" + n[2:].replace("-", "_") for n in names if n.startswith("--") and "-" in n[2:])]
        parser.add_argument(*spellings, dest=dest, default=_env_default(dest, default), **kwargs)

    add("--nproc-per-node", default="1", help="workers on this node: an integer, or 'cpu'/'auto' (the CPU count)")
    add("--nnodes", default="1", help="number of nodes: N, or MIN:MAX (c10d rendezvous)")
    add("--node-rank", type=int, default=0, help="rank of this node (static rendezvous)")
    add("--master-addr", default="127.0.0.1", help="static rendezvous: address of node 0, which hosts the store")
    add("--master-port", type=_port, default=None,
        help="static rendezvous: port of the store (default: a free port for one node, 29500 for several)")
    add("--rdzv-backend", default="static", choices=["static", "c10d"], help="rendezvous backend (default static)")
    add("--rdzv-endpoint", default="", help="c10d rendezvous: HOST[:PORT] of the store (port 29400 by default)")
    add("--rdzv-id", default="", help="job id, exported as TORCHELASTIC_RUN_ID (default: 'none'; random "
        "when the store takes a free port)")
    add("--rdzv-conf", default="", help="rendezvous settings: join_timeout=S,last_call_timeout=S,read_timeout=S")
    add("--max-restarts", type=int, default=0, help="failure restarts allowed for the whole job (default 0)")
    add("--monitor-interval", type=float, default=0.1, help="seconds between looks at the other nodes' news")
    add("--role", default="default", help="role name, exported as ROLE_NAME")
    add("--log-dir", default=None, help="directory for the workers' log files and error records")
    add("-r", "--redirects", default="0", help="streams sent only to log files: 0-3 or LOCAL_RANK:0-3,...")
    add("-t", "--tee", default="0", help="streams sent to log files and the console: 0-3 or LOCAL_RANK:0-3,...")
    add("--local-ranks-filter", default="", help="show only these local ranks' output on the console: 0,1,...")
    add("--local-addr", default="", help="this node's address, as the other nodes see it")
    add("--shutdown-timeout", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL (default 5)")
    add("--on-failure", default="restart", choices=["restart", "continue", "replace"],
        help="a worker failing: stop the others and restart or end the job (torchrun's, the default); "
        "continue: report it and let the others go on (they recover with shrink_group), exit 0 when a worker "
        "exited 0; replace: as continue, and start a replacement that joins the running job (PYDIST_JOIN=1; "
        "the others admit it with admit_joiners)")
    add("--max-replacements", type=int, default=10,
        help="--on-failure replace: replacements allowed for the whole job (default 10); past them, continue")
    for part, what in (("cert", "this node's certificate"), ("key", "its private key"),
                       ("ca", "the CA certificate every node's must chain to")):
        add(f"--tls-{part}", default=None,
            help=f"mutual TLS for the store and the workers (PYDIST_TLS_{part.upper()}): {what}, a PEM file")
    parser.add_argument("--standalone", action="store_true", default=_flag_default("standalone"),
                        help="single node: a c10d store on a free local port, a random job id")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("-m", "--module", action="store_true", default=_flag_default("module"),
                      help="run the script argument as a module, like 'python -m'")
    mode.add_argument("--no-python", "--no_python", dest="no_python", action="store_true",
                      default=_flag_default("no_python"), help="run the script argument as an executable")
    mode.add_argument("--run-path", "--run_path", dest="run_path", action="store_true",
                      default=_flag_default("run_path"), help="run the script with runpy.run_path in each worker")
    parser.add_argument("training_script", help="the script (or module, or executable) every worker runs")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return parser


def nproc_from(value: str) -> int:
    """``--nproc-per-node``: an integer >= 1, or 'cpu'/'auto' (the CPU count)."""
    if value in ("cpu", "auto"):
        return os.cpu_count() or 1
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"unsupported --nproc-per-node value: {value!r} (an integer, 'cpu' or 'auto')") from None
    if count < 1:
        raise ValueError(f"--nproc-per-node must be at least 1, got {count}")
    return count


def nnodes_from(value: str) -> tuple[int, int]:
    """``--nnodes``: N or MIN:MAX, as (min, max)."""
    parts = value.split(":")
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"--nnodes: expected N or MIN:MAX, got {value!r}")
    low, high = int(parts[0]), int(parts[-1])
    if not 1 <= low <= high:
        raise ValueError(f"--nnodes: expected 1 <= MIN <= MAX, got {value!r}")
    return low, high


RDZV_CONF = {"join_timeout": "join_timeout", "timeout": "join_timeout", "last_call_timeout": "last_call_timeout",
             "read_timeout": "connect_timeout"}


def rdzv_conf_from(text: str) -> dict[str, Any]:  # LaunchConfig keyword arguments (float seconds)
    """``--rdzv-conf k=v,...`` as LaunchConfig fields; ValueError for unknown or bad entries."""
    conf: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in RDZV_CONF:
            raise ValueError(f"--rdzv-conf: expected KEY=VALUE with KEY in {sorted(RDZV_CONF)}, got {item!r}")
        try:
            conf[RDZV_CONF[key]] = float(value)
        except ValueError:
            raise ValueError(f"--rdzv-conf: {key} must be a number of seconds, got {value!r}") from None
    return conf


def _host_port(endpoint: str, default_port: int) -> tuple[str, int]:
    """``HOST[:PORT]`` as torchrun reads it; an IPv6 address in brackets: ``[::1]:29400``
    (a bare IPv6 address without a port is taken whole)."""
    endpoint = endpoint.strip()
    if endpoint.startswith("[") and "]" in endpoint:
        host, _, rest = endpoint[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ValueError(f"--rdzv-endpoint: expected [IPV6]:PORT, got {endpoint!r}")
        port = rest[1:]
    elif endpoint.count(":") == 1:
        host, _, port = endpoint.partition(":")
    else:
        host, port = endpoint, ""
    if not port:
        return host or "127.0.0.1", default_port
    if not port.isdigit() or int(port) >= 1 << 16:
        raise ValueError(f"--rdzv-endpoint: expected HOST[:PORT] or [IPV6]:PORT with a port below 65536, "
                         f"got {endpoint!r}")
    return host, int(port)


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """The launch configuration for parsed arguments (ValueError for invalid combinations)."""
    min_nodes, max_nodes = nnodes_from(str(args.nnodes))
    backend, run_id = args.rdzv_backend, args.rdzv_id
    if args.standalone:
        if max_nodes != 1:
            raise ValueError("--standalone runs a single node: drop --nnodes or use --nnodes 1")
        backend, run_id, endpoint = "c10d", "", "127.0.0.1:0"
    else:
        endpoint = args.rdzv_endpoint
    if backend == "static":
        if min_nodes != max_nodes:
            raise ValueError("--nnodes MIN:MAX needs --rdzv-backend c10d")
        node_rank = int(args.node_rank)
        if not 0 <= node_rank < max_nodes:
            raise ValueError(f"--node-rank must be in [0, {max_nodes}), got {node_rank}")
        port = args.master_port if args.master_port is not None else (0 if max_nodes == 1 else 29500)
        host = args.master_addr
    else:
        node_rank = -1
        host, port = _host_port(endpoint, 29400)
    if (args.shutdown_timeout < 0 or args.monitor_interval <= 0 or int(args.max_restarts) < 0
            or int(args.max_replacements) < 0):
        raise ValueError("--shutdown-timeout, --max-restarts and --max-replacements must be >= 0, "
                         "--monitor-interval > 0")
    logs = LogSpec(args.log_dir, parse_streams(str(args.redirects)), parse_streams(str(args.tee)),
                   parse_ranks_filter(str(args.local_ranks_filter)))
    return LaunchConfig(
        nproc_per_node=nproc_from(str(args.nproc_per_node)),
        command=worker_command(args.training_script, args.training_script_args, args.module, args.no_python,
                               args.run_path),
        entrypoint=args.training_script,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        node_rank=node_rank,
        master_addr=host,
        master_port=int(port),
        run_id=run_id or (str(uuid.uuid4()) if port == 0 else "none"),  # torchrun's default id is "none"
        role=args.role,
        max_restarts=int(args.max_restarts),
        on_failure=args.on_failure,
        max_replacements=int(args.max_replacements),
        shutdown_timeout=float(args.shutdown_timeout),
        monitor_interval=float(args.monitor_interval),
        local_addr=args.local_addr,
        logs=logs,
        **rdzv_conf_from(str(args.rdzv_conf)),
    )


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``pydist-run`` and ``python -m pydist.run``: exits with the job's code."""
    from ..net.accepting import raise_descriptor_limit
    from .agent import Agent

    raise_descriptor_limit()  # this process hosts the job's store: a descriptor per client
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _export_tls(args)
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    problem = cannot_start(args)
    if problem is not None:
        parser.exit(2, f"pydist-run: error: {problem}\n")
    sys.exit(Agent(config).run())


def cannot_start(args: argparse.Namespace) -> str | None:
    """Why no worker could start, found before starting any: a bad PYDIST_* value (every
    worker would fail on it), or a script or program that does not exist. None if none."""
    try:
        settings()
    except ValueError as exc:
        return str(exc)
    script = args.training_script
    if args.module:
        return None  # found by the workers' interpreter, on their path
    if args.no_python and not args.run_path:
        if shutil.which(script) is None:
            where = "" if os.sep in script else f" on PATH ({os.environ.get('PATH', '')})"
            return f"the program {script!r} does not exist or is not executable{where} (--no-python)"
        return None
    if not os.path.isfile(script):
        where = "" if os.path.isabs(script) else f" (relative to {os.getcwd()})"
        return f"the script {script!r} does not exist{where}"
    return None


def _export_tls(args: argparse.Namespace) -> None:
    """--tls-* as PYDIST_TLS_* (absolute paths) for the store and the workers; ValueError if the
    three do not come together (with the environment's) or cannot be loaded."""
    from ..net.tls import VARIABLES, contexts
    given = {name: os.path.abspath(path) for name, path in zip(VARIABLES, (args.tls_cert, args.tls_key, args.tls_ca))
             if path}
    if given:
        os.environ.update(given)
        contexts()
