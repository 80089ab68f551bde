"""A rank SIGKILLed in a loop of 16 MiB collectives over tcp: 4 ranks with shared memory off,
4 ranks posing as 4 hosts, and 2 network-namespace hosts x 2 ranks (tcp between the hosts,
shared memory inside each). Every survivor raises a PeerFailedError naming the dead rank
soon after the kill (well under 2 s on an idle machine), not at the 30 s timeout. The
survivors stay alive after raising, so nothing is learned from their sockets closing
(tests/run_scripts/broadcast_root_killed.py)."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from pydist.testing import free_port
from pydist.testing.commands import finish, start_command
from pydist.testing.netns import Network, require_netns

pytestmark = pytest.mark.slow  # 4 processes moving 16 MiB messages, several runs

SCRIPT = Path(__file__).parent / "run_scripts" / "broadcast_root_killed.py"
#: Seconds from the kill within which a survivor must raise. Its group timeout is 30 s, so a
#: PeerFailedError this early came from detecting the death, not from the timeout; how fast
#: detection is (well under 2 s when idle) is measured by the soak runs, not asserted here,
#: where a loaded machine may stall a process for seconds.
BEFORE_THE_TIMEOUT_S = 20.0
Start = Callable[[int, list[str], dict[str, str]], subprocess.Popen]


def _run(start: Start, master: str, env: dict[str, str], argv: list[str]) -> dict[int, dict]:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="raised-") as raised:  # where the survivors mark that they raised
        procs = []
        for rank in range(4):
            rank_env = {**os.environ, **{k: v.replace("{rank}", str(rank)) for k, v in env.items()},
                        "RANK": str(rank), "WORLD_SIZE": "4", "MASTER_ADDR": master, "MASTER_PORT": str(port)}
            procs.append(start(rank, [sys.executable, str(SCRIPT), *argv, raised], rank_env))
        results = finish(procs, timeout=90)
    lines = [json.loads(line) for result in results for line in result.stdout.splitlines() if line.startswith("{")]
    return {line["rank"]: line for line in lines}


def _check(start: Start, master: str, env: dict[str, str], op: str = "broadcast", victim: int = 0) -> None:
    for run in range(3):
        delay = random.Random(run).uniform(0.5, 2.0)
        survivors = _run(start, master, env, [str(delay), op, str(victim)])
        assert sorted(survivors) == sorted(set(range(4)) - {victim}), survivors
        for rank, report in survivors.items():
            assert report["error_rank"] == victim and f"rank {victim}" in report["message"], report
            assert report["type"] == "PeerFailedError", report
            assert report["after_kill_s"] < BEFORE_THE_TIMEOUT_S, \
                f"run {run}, rank {rank} raised {report['after_kill_s']:.1f} s after the kill: {report['message']}"


def _local(rank: int, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    return start_command(argv, env=env)


@pytest.mark.parametrize("env", [{"PYDIST_SHM": "0"}, {"PYDIST_HOST_ID": "host{rank}"}], ids=["tcp", "4-hosts"])
def test_every_survivor_names_the_dead_root_before_the_timeout(env):
    _check(_local, "127.0.0.1", env)


@pytest.mark.parametrize("op, victim", [("broadcast", 0), ("broadcast", 3), ("all_reduce", 2)],
                         ids=["broadcast-root", "broadcast-leaf", "all_reduce"])
def test_two_hosts_two_ranks_each_every_survivor_names_the_dead_rank(op, victim):
    """Ranks 0, 1 on namespace host 0 and ranks 2, 3 on host 1."""
    require_netns()
    with Network(hosts=2) as net:
        def start(rank: int, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
            return net.popen(rank // 2, argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        _check(start, net.hosts[0].addr, {}, op, victim)
