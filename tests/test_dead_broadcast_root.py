"""A broadcast root SIGKILLed in a loop of 16 MiB broadcasts, 4 ranks over tcp (shared memory
off, or 4 ranks posing as 4 hosts): every survivor raises a DistNetworkError naming rank 0
within 2 s of the kill, not at the 30 s timeout. The survivors stay alive after raising, so
nothing is learned from their sockets closing."""
from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import pytest

from pydist.testing import free_port
from pydist.testing.commands import finish, start_command

pytestmark = pytest.mark.slow  # 4 processes moving 16 MiB messages, several runs

SCRIPT = Path(__file__).parent / "run_scripts" / "broadcast_root_killed.py"


def _run(env: dict[str, str], delay: float) -> dict[int, dict]:
    port = free_port()
    procs = []
    for rank in range(4):
        rank_env = {**os.environ, **{k: v.replace("{rank}", str(rank)) for k, v in env.items()},
                    "RANK": str(rank), "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(start_command([sys.executable, str(SCRIPT), str(delay)], env=rank_env))
    results = finish(procs, timeout=90)
    lines = [json.loads(line) for result in results for line in result.stdout.splitlines() if line.startswith("{")]
    return {line["rank"]: line for line in lines}


@pytest.mark.parametrize("env", [{"PYDIST_SHM": "0"}, {"PYDIST_HOST_ID": "host{rank}"}], ids=["tcp", "4-hosts"])
def test_every_survivor_names_the_dead_root_within_two_seconds(env):
    for run in range(3):
        delay = random.Random(run).uniform(0.5, 2.0)
        survivors = _run(env, delay)
        assert sorted(survivors) == [1, 2, 3], survivors
        for rank, report in survivors.items():
            assert report["error_rank"] == 0 and "rank 0" in report["message"], report
            assert report["type"] == "PeerFailedError", report
            assert report["after_kill_s"] < 2.0, f"run {run}, rank {rank} raised {report['after_kill_s']:.1f} s " \
                                                 f"after the kill: {report['message']}"
