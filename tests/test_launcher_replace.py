"""pydist-run --on-failure replace end to end: a worker SIGKILLed mid-job is replaced by a process
that joins the running job (PYDIST_JOIN=1) and the world grows back to its size; over shared
memory and over tcp; the replacements a job allows are bounded (tests/run_scripts/replace_worker.py)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from pydist.testing.commands import run_command

pytestmark = pytest.mark.slow

SCRIPT = str(Path(__file__).parent / "run_scripts" / "replace_worker.py")
#: seconds a 3-rank job of a few hundred tiny steps, a kill and a replacement may take on a
#: loaded 2-core machine before the test calls it hung (it takes a few seconds)
NOT_HUNG = 120.0


def _launch(*flags: str, env: dict[str, str] | None = None, steps: int = 30, kill_rank: int = 2,
            kill_step: int = 5, wait_full: bool = True):
    argv = [sys.executable, "-m", "pydist.run", "--nproc-per-node", "3", *flags, SCRIPT,
            str(steps), str(kill_rank), str(kill_step), str(int(wait_full))]
    return run_command(argv, timeout=NOT_HUNG, env={**os.environ, **(env or {})})


def _results(stdout: str) -> list[dict]:
    return [json.loads(line.split("RESULT ", 1)[1]) for line in stdout.splitlines() if "RESULT " in line]


@pytest.mark.parametrize(("env", "victim"), [({}, 2), ({"PYDIST_SHM": "0"}, 2), ({}, 0)],
                         ids=["shm", "tcp", "rank 0 (first in the store's job record)"])
def test_a_killed_worker_is_replaced_and_the_world_grows_back(env, victim):
    done = _launch("--on-failure", "replace", env=env, kill_rank=victim)
    assert done.returncode == 0, done.stderr
    results = _results(done.stdout)
    assert sorted(r["joined"] for r in results) == [False, False, True]
    assert all(size == total for r in results for size, total in r["steps"])  # every all_reduce exact
    members = [r for r in results if not r["joined"]]
    for result in members:
        sizes = [size for size, _ in result["steps"]]
        # shrank to 2, then grew back. No step need run at 2: a replacement already waiting when
        # the shrink ends is admitted in the next step, before its all_reduce.
        assert result["shrunk_to"] == [2], result
        assert sizes[:5] == [3] * 5 and sizes[-1] == 3, sizes
    assert sorted(r["rank"] for r in results) == [0, 1, 2]
    assert "replacement 1 of 10 started" in done.stderr and f"failed and were replaced: rank {victim}" in done.stderr


def test_past_the_replacements_allowed_the_others_go_on():
    """--max-replacements 0: the failure is reported and the survivors finish on their own."""
    done = _launch("--on-failure", "replace", "--max-replacements", "0", steps=12, wait_full=False)
    assert done.returncode == 0, done.stderr
    assert "no replacements left (--max-replacements 0)" in done.stderr
    results = _results(done.stdout)
    assert [r["joined"] for r in results] == [False, False]
    assert all(r["steps"][-1] == [2, 2.0] and len(r["steps"]) == 12 for r in results)


def test_a_replacement_the_job_ended_without_is_not_left_waiting():
    """The survivors finish their 12 tiny steps before the replacement is ready to join: it
    learns that the job ended (its rank 0 left) instead of waiting for an admission that will
    never come, and the launcher exits 0 without starting another."""
    done = _launch("--on-failure", "replace", steps=12, wait_full=False)
    assert done.returncode == 0, done.stderr
    results = _results(done.stdout)
    assert [r["joined"] for r in results] == [False, False]
    assert "the job ended before admitting it" in done.stderr, done.stderr
    assert "replacement 2 of" not in done.stderr, done.stderr
