"""``pydist-bench --netns HxM [--link RATE] [--nics N]``: the benchmark as a multi-node job on one machine.

H network namespaces are the hosts (:mod:`pydist.testing.netns`: one veth each on a bridge,
``--link`` shapes every host's link, e.g. ``1gbit``; ``--nics N``: N interfaces each, on N
separate networks, all named to pydist by PYDIST_SOCKET_IFNAME=eth, so it stripes large
messages over them; ``--compare pydist-1nic`` is the same on one), each runs pydist-run with M ranks,
static rendezvous at host 0, and pydist-bench inside that job: pydist uses shared memory
inside a host and TCP between hosts, as on a real cluster, and every ``--compare`` backend
runs in the same job (gloo on the namespaces' ``eth0``). Rank 0's table is printed. Needs
root and iproute2; the namespaces and every process are removed at the end.
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass

MASTER_PORT = 29500  # each namespace has its own ports: no clash with the machine's
RANK0 = "[rank0]:"  # pydist-run's prefix of rank 0's lines


@dataclass(frozen=True)
class Shape:
    hosts: int
    ranks_per_host: int

    def __str__(self) -> str:
        return f"{self.hosts}x{self.ranks_per_host}"


def parse_shape(text: str) -> Shape:
    """``HxM``: H hosts (>= 2) of M ranks (>= 1) each."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if match is None:
        raise ValueError(f"expected HOSTSxRANKS such as 2x2, got {text!r}")
    shape = Shape(int(match.group(1)), int(match.group(2)))
    if shape.hosts < 2 or shape.ranks_per_host < 1:
        raise ValueError(f"expected at least 2 hosts of at least 1 rank, got {text!r}")
    return shape


def forwarded(argv: list[str]) -> list[str]:
    """``argv`` without --netns, --link and --nics (each as ``--opt value`` or ``--opt=value``)."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--netns", "--link", "--nics"):
            skip = True
        elif not arg.startswith(("--netns=", "--link=", "--nics=")):
            kept.append(arg)
    return kept


def job_args(argv: list[str]) -> list[str]:
    """The arguments of every rank of the job: ``forwarded(argv)``, and the user's whole
    command (``--shown-command``), which rank 0's table shows: the one to run again."""
    return [*forwarded(argv), "--shown-command", shlex.join(["pydist-bench", *argv])]


def host_command(shape: Shape, host: int, master: str, bench_args: list[str], module: str = "pydist.bench"
                 ) -> list[str]:
    """pydist-run on ``host`` of the job, starting ``module`` (pydist-bench) in every rank."""
    return [sys.executable, "-m", "pydist.run", "--nnodes", str(shape.hosts), "--nproc-per-node",
            str(shape.ranks_per_host), "--node-rank", str(host), "--master-addr", master, "--master-port",
            str(MASTER_PORT), "-m", module, *bench_args]


def run(shape: Shape, link: str | None, bench_args: list[str], timeout: float, module: str = "pydist.bench",
        extra_env: dict[str, str] | None = None, nics: int = 1) -> int:
    """Run the job (``module`` with ``bench_args`` in every rank, ``extra_env`` added to their
    environment); print rank 0's output (launcher prefixes removed); 0, or 1 with the failing
    hosts' error output."""
    from ..testing.netns import Network, netns_available
    ok, why = netns_available(shaping=link is not None)
    if not ok:
        print(f"pydist-bench: error: --netns needs network namespaces: {why}", file=sys.stderr)
        return 1
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "eth0", **(extra_env or {})}
    if nics > 1:
        env["PYDIST_SOCKET_IFNAME"] = "eth"
    with Network(hosts=shape.hosts, rate=link, interfaces=nics) as net:
        procs = [net.popen(host, host_command(shape, host, net.hosts[0].addr, bench_args, module), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for host in range(shape.hosts)]
        try:
            outputs = [proc.communicate(timeout=timeout) for proc in procs]
        except subprocess.TimeoutExpired:
            print(f"pydist-bench: error: the {shape} job took over {timeout:g} s", file=sys.stderr)
            return 1
    for line in outputs[0][0].splitlines():
        print(line[len(RANK0):] if line.startswith(RANK0) else line)
    failed = [host for host, proc in enumerate(procs) if proc.returncode]
    for host in failed:
        print(f"pydist-bench: host {host} of the {shape} job exited with {procs[host].returncode}:\n"
              f"{outputs[host][1][-3000:]}", file=sys.stderr)
    return 1 if failed else 0
