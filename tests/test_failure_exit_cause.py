"""A rank that ends with its groups alive tells its peers why (issue 48): one that failed (an
uncaught exception, a failing sys.exit) is named as failed, with its exception, never as a
rank that shut down its process group; only destroy_process_group reads as a shutdown.

The recorder of the cause (pydist.core.exit_cause) is tested on its hooks; the goodbye over a
real TCP transport with thread-ranks; the whole path with real processes under pydist-run,
torchrun, mpiexec and torch.multiprocessing.spawn (tests/run_scripts/crashing_rank.py).
"""
from __future__ import annotations

import json
import re
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from child_env import with_tests_on_path
from test_rendezvous_launch_env import MPIEXEC, clean_env

import pydist
from pydist.core import exit_cause
from pydist.groups import farewell
from pydist.groups.factory import leave
from pydist.groups.world import current
from pydist.testing import run_threads
from pydist.testing.commands import run_command

SCRIPT = str(Path(__file__).parent / "run_scripts" / "crashing_rank.py")
TWO_HOSTS = ["a", "b"]
SHUTDOWN = "destroy_process_group)"  # how a peer that shut down its process group reads


# --- the recorder's hooks (no processes) ------------------------------------------------------

@pytest.fixture
def hooks(monkeypatch):
    """A fresh recorder over stand-in hooks: the calls each previous hook got."""
    calls: list[tuple] = []
    monkeypatch.setattr(exit_cause, "_watching", False)
    monkeypatch.setattr(exit_cause, "_cause", None)
    monkeypatch.setattr(sys, "excepthook", lambda *args: calls.append(("excepthook", args[1])))
    monkeypatch.setattr(threading, "excepthook", lambda args: calls.append(("thread", args.exc_value)))
    monkeypatch.setattr(sys, "exit", lambda status=None: calls.append(("exit", status)))
    exit_cause.watch()
    exit_cause.watch()  # once per process: a second call chains nothing more
    return calls


def test_an_uncaught_exception_is_the_cause_and_the_previous_hook_still_runs(hooks):
    error = ValueError("rank one broke")
    sys.excepthook(ValueError, error, None)
    assert exit_cause.cause() == "ValueError: rank one broke"
    assert hooks == [("excepthook", error)]


def test_a_failing_exit_status_is_the_cause_a_clean_one_is_not(hooks):
    sys.exit(0)
    sys.exit()
    assert exit_cause.cause() is None
    sys.exit(3)
    assert exit_cause.cause() == "sys.exit(3)"
    assert hooks == [("exit", 0), ("exit", None), ("exit", 3)]


def test_an_exit_while_handling_an_exception_names_it(hooks):
    """What torch.multiprocessing.spawn's children do with the exception of the function they ran."""
    try:
        raise KeyError("missing")
    except KeyError:
        sys.exit(1)
    assert exit_cause.cause() == "KeyError: 'missing', then sys.exit(1)"


def test_a_thread_s_exception_is_named_with_its_thread(hooks):
    thread = threading.Thread(target=lambda: 1 / 0, name="loader")
    thread.start()
    thread.join()
    assert exit_cause.cause() == "ZeroDivisionError: division by zero (in thread 'loader')"


def test_the_first_failure_is_kept_and_a_long_one_is_cut(hooks):
    sys.excepthook(RuntimeError, RuntimeError("x" * 5000), None)
    sys.exit(2)
    cause = exit_cause.cause()
    assert cause is not None and cause.startswith("RuntimeError: xxx") and cause.endswith("...")
    assert len(cause) == exit_cause.MAX_CAUSE


# --- the goodbye, thread-ranks over TCP ---------------------------------------------------------

def _rank1_ends(rank: int, size: int, cause: str | None) -> str:
    """Rank 1 ends as at interpreter exit (api.init: the goodbye with ``cause``, then the world
    left); rank 0 then receives from it, and returns the error. (destroy_process_group's wording:
    tests/test_errors_wording.py::test_a_peer_that_left_reads_as_a_closed_connection.)"""
    pydist.barrier()
    if rank == 0:
        with pytest.raises(pydist.DistError) as raised:
            pydist.recv(np.zeros(2), src=1)
        return str(raised.value)
    farewell.say_goodbye(current(), cause)
    leave(current(), finished=False)
    pydist.init_process_group(store=pydist.HashStore(), rank=0, world_size=1)  # the harness destroys it
    return "left"


def test_a_rank_that_failed_is_named_as_failed_with_its_exception():
    error, _ = run_threads(2, _rank1_ends, "ValueError: rank one broke", transport="tcp", hosts=TWO_HOSTS, timeout=60)
    assert "rank 1 on localhost (127.0.0.1, lo) failed (ValueError: rank one broke)" in error, error
    assert SHUTDOWN not in error, error


def test_a_rank_that_exits_without_destroy_is_not_a_shutdown():
    error, _ = run_threads(2, _rank1_ends, None, transport="tcp", hosts=TWO_HOSTS, timeout=60)
    assert "rank 1 on localhost (127.0.0.1, lo) exited without destroy_process_group" in error, error
    assert SHUTDOWN not in error and "failed" not in error, error


# --- real processes under each launcher ---------------------------------------------------------

def _rank0_error(stdout: str) -> str | None:
    found = re.search(r'\{"rank0_error": .*\}', stdout)
    assert found, stdout
    return json.loads(found.group(0))["rank0_error"]


def _launch(launcher: str, mode: str, api: str, **env: str) -> str:
    """Run crashing_rank.py's two ranks under ``launcher``; rank 0's error."""
    argv = {"pydist-run": [sys.executable, "-m", "pydist.run", "--nproc-per-node", "2", SCRIPT, mode, api],
            "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", SCRIPT, mode, api],
            "mpiexec": [str(MPIEXEC), "-n", "2", sys.executable, SCRIPT, mode, api],
            "spawn": [sys.executable, SCRIPT, mode, api, "spawn"]}[launcher]
    # 90 s: under pytest-timeout's 120, so that a hung job is killed and its output shown
    result = run_command(argv, timeout=90, env=with_tests_on_path(clean_env(**env)))
    error = _rank0_error(result.stdout)
    assert error is not None, result.stdout + result.stderr
    return error


@pytest.mark.slow
@pytest.mark.parametrize("launcher, api", [("pydist-run", "pydist"), ("torchrun", "pydist"), ("torchrun", "torch"),
                                           ("mpiexec", "pydist"), ("spawn", "pydist"), ("spawn", "torch")])
def test_a_rank_that_raises_is_named_as_failed_under_every_launcher(launcher, api):
    if launcher in ("torchrun", "spawn") or api == "torch":
        pytest.importorskip("torch")
    if launcher == "mpiexec" and not MPIEXEC.exists():
        pytest.skip("no mpiexec next to the interpreter")
    error = _launch(launcher, "raise", api)
    assert "rank 1 on " in error and "failed (ValueError: rank one broke" in error, error
    assert SHUTDOWN not in error, error


@pytest.mark.slow
@pytest.mark.parametrize("mode, cause", [("exit3", "failed (sys.exit(3))"),
                                         ("memory", "failed (MemoryError: Unable to allocate")])
def test_a_failing_exit_and_a_memory_error_over_tcp_are_failures(mode, cause):
    error = _launch("pydist-run", mode, "pydist", PYDIST_SHM="0")
    assert "rank 1 on " in error and cause in error, error
    assert SHUTDOWN not in error, error


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sigkill", "sigsegv"])
def test_a_rank_killed_by_a_signal_reads_as_a_failure_not_a_shutdown(mode):
    """No hook runs (the signal's default action): the peer reads the connection's loss."""
    error = _launch("pydist-run", mode, "pydist")
    assert "rank 1 on " in error and "closed its connection to rank 0 unexpectedly: its process exited or was " \
        "killed" in error, error
    assert SHUTDOWN not in error and "exited without" not in error, error


@pytest.mark.slow
def test_raise_systemexit_reads_as_an_exit_without_destroy_a_documented_limit():
    """``raise SystemExit(3)`` (not sys.exit) reaches no hook, and the interpreter clears it
    before its exit handlers run: the peers cannot be told it failed (docs/guide/fault-tolerance.md).
    If this starts failing, the limit is gone: say so on that page."""
    error = _launch("pydist-run", "raise3", "pydist")
    assert "rank 1 on " in error and "exited without destroy_process_group" in error, error
    assert SHUTDOWN not in error, error


@pytest.mark.slow
def test_a_clean_exit_without_destroy_and_a_destroy_read_as_what_they_are():
    ended = _launch("pydist-run", "clean", "pydist")
    assert "exited without destroy_process_group" in ended and "failed (" not in ended, ended
    destroyed = _launch("pydist-run", "destroy", "pydist")
    assert "has shut down its process group (destroy_process_group)" in destroyed, destroyed
