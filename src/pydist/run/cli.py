"""``pydist-run``: torchrun's command line, single host.

::

    pydist-run [--nproc-per-node N|cpu|auto] [--nnodes 1] [--node-rank 0]
               [--master-addr 127.0.0.1] [--master-port P] [--standalone]
               [--rdzv-id ID] [--role NAME] [--shutdown-timeout S]
               [-m | --no-python] script [script args...]

Flags take dash or underscore spellings (``--nproc_per_node``) and, like torchrun, default
to ``$PET_<NAME>`` (``PET_NPROC_PER_NODE=4``) when set. Everything after the script is
passed to it untouched, even if it looks like a launcher flag; an unknown flag before the
script is an error (exit 2). ``--master-port`` defaults to 0: the launcher's store takes a
free port and workers get it as MASTER_PORT (torchrun's ``--standalone`` behaviour, which
is therefore always on). ``--rdzv-id`` defaults to a random id. ``--shutdown-timeout``
(grace period before SIGKILL) defaults to 5 s, not torchrun's 30.
"""
from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Sequence
from typing import Any, NoReturn

from .config import LaunchConfig, worker_command


def _env_default(dest: str, default: Any) -> Any:
    """torchrun's ``PET_<DEST>`` environment override of a flag's default."""
    return os.environ.get(f"PET_{dest.upper()}", default)


def _flag_default(dest: str) -> bool:
    return bool(int(os.environ.get(f"PET_{dest.upper()}", "0")))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; flag names, spellings and meanings are torchrun's."""
    parser = argparse.ArgumentParser(
        prog="pydist-run", description="Launch a pydist job: N worker processes on this host."
    )
    add = parser.add_argument
    add("--nproc-per-node", "--nproc_per_node", default=_env_default("nproc_per_node", "1"),
        help="workers on this node: an integer, or 'cpu'/'auto' for os.cpu_count() (default 1)")
    add("--nnodes", default=_env_default("nnodes", "1"), help="number of nodes, N or N:N (only 1 for now)")
    add("--node-rank", "--node_rank", type=int, default=_env_default("node_rank", 0), help="rank of this node")
    add("--master-addr", "--master_addr", default=_env_default("master_addr", "127.0.0.1"),
        help="address of the store, exported as MASTER_ADDR (default 127.0.0.1)")
    add("--master-port", "--master_port", type=int, default=_env_default("master_port", 0),
        help="port of the store, exported as MASTER_PORT (default 0: a free port)")
    add("--standalone", action="store_true", default=_flag_default("standalone"),
        help="torchrun compatibility: store on a free port (ignores --master-port)")
    add("--rdzv-id", "--rdzv_id", default=_env_default("rdzv_id", ""),
        help="job id, exported as TORCHELASTIC_RUN_ID (default: random)")
    add("--role", default=_env_default("role", "default"), help="role name, exported as ROLE_NAME")
    add("--shutdown-timeout", "--shutdown_timeout", type=float, default=_env_default("shutdown_timeout", 5.0),
        help="seconds between SIGTERM and SIGKILL when stopping workers (default 5)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("-m", "--module", action="store_true", default=_flag_default("module"),
                      help="run the script argument as a module, like 'python -m'")
    mode.add_argument("--no-python", "--no_python", action="store_true", default=_flag_default("no_python"),
                      help="run the script argument as an executable, without python")
    add("training_script", help="the script (or module, or executable) every worker runs")
    add("training_script_args", nargs=argparse.REMAINDER, help="arguments for the script")
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


def nnodes_from(value: str) -> int:
    """``--nnodes``: N or N:N; only a single node is supported for now."""
    parts = value.split(":")
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"--nnodes: expected N or MIN:MAX, got {value!r}")
    low, high = int(parts[0]), int(parts[-1])
    if low != high:
        raise ValueError("--nnodes MIN:MAX (elastic node counts) is not supported yet")
    if low != 1:
        raise ValueError("--nnodes > 1 is not supported yet: pydist-run launches on a single host")
    return low


def config_from_args(args: argparse.Namespace) -> LaunchConfig:
    """The launch configuration for parsed arguments (ValueError for invalid combinations)."""
    nnodes = nnodes_from(str(args.nnodes))
    node_rank = int(args.node_rank)
    if not 0 <= node_rank < nnodes:
        raise ValueError(f"--node-rank must be in [0, {nnodes}), got {node_rank}")
    if args.shutdown_timeout < 0:
        raise ValueError("--shutdown-timeout must be >= 0")
    port = 0 if args.standalone else int(args.master_port)
    return LaunchConfig(
        nproc_per_node=nproc_from(str(args.nproc_per_node)),
        command=worker_command(args.training_script, args.training_script_args, args.module, args.no_python),
        entrypoint=args.training_script,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=args.master_addr,
        master_port=port,
        run_id=args.rdzv_id or str(uuid.uuid4()),
        role=args.role,
        shutdown_timeout=float(args.shutdown_timeout),
    )


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """Entry point of ``pydist-run`` and ``python -m pydist.run``: exits with the job's code."""
    from .agent import LocalAgent

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    sys.exit(LocalAgent(config).run())
