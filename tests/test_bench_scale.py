"""pydist-bench --scale: the hooks it reads (store server counts, init marks), its pieces,
and real runs at 4 and 8 ranks. Values are checked to be measured (present, nonzero,
consistent), never timed against a bound (benchmarks are a CLI, never asserts)."""
import os
import resource
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest

import pydist as dist
from pydist.bench import cli, fd_limit
from pydist.bench.proc_usage import descriptors, rss_mib
from pydist.bench.scale import parse_scale, run_ranks
from pydist.bench.scale_report import RANK_ROWS, format_table, summarize
from pydist.core import init_marks
from pydist.store import TCPStore
from pydist.testing import free_port
from pydist.testing.commands import run_command

BENCH = [sys.executable, "-m", "pydist.bench"]
TIMEOUT = timedelta(seconds=30)


# -- the hooks ---------------------------------------------------------------------------------------
def _settled(master: TCPStore, connections: int) -> dict:
    """The server's counts once it has seen connections close down to ``connections`` (it
    learns of a close on its own thread), or after 10 s."""
    deadline = time.monotonic() + 10
    while (stats := master.server_stats())["connections"] > connections and time.monotonic() < deadline:
        time.sleep(0.01)
    return stats


def test_store_server_counts_requests_by_name_and_connections():
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT) as master:
        before = master.server_stats()
        with TCPStore("127.0.0.1", master.port, timeout=TIMEOUT) as client:
            client.set("a", b"1")
            client.add("n", 2)
            client.wait(["a"])
            assert client.get("a") == b"1"
            assert client.server_stats() is None  # a client only: no server here
            during = master.server_stats()
        after = _settled(master, during["connections"] - 1)
    assert before is not None and during is not None and after is not None
    added = {name: during["requests"].get(name, 0) - before["requests"].get(name, 0) for name in during["requests"]}
    assert added["set"] == 1 and added["add"] == 1 and added["wait"] == 1 and added["multi_get"] == 1
    assert during["connections"] == before["connections"] + 1
    assert during["peak_connections"] >= 2 and during["opened"] == before["opened"] + 1
    assert after["connections"] == before["connections"] and after["peak_connections"] == during["peak_connections"]


def test_init_marks_every_step_in_order():
    dist.init_process_group("pydist", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=TIMEOUT)
    try:
        marks = init_marks.marks()
    finally:
        dist.destroy_process_group()
    assert list(marks) == list(init_marks.STEPS)
    times = [marks[step] for step in init_marks.STEPS]
    assert times == sorted(times) and times[-1] > times[0]


def test_a_new_init_starts_the_marks_over():
    init_marks.mark(init_marks.INIT_DONE)
    init_marks.mark(init_marks.INIT_START)
    assert list(init_marks.marks()) == [init_marks.INIT_START]


# -- the pieces --------------------------------------------------------------------------------------
def test_parse_scale():
    assert parse_scale("8") == [8]
    assert parse_scale("8, 16,8,4") == [8, 16, 4]
    for bad in ("1", "0", "x", "8,,16", "-4"):
        with pytest.raises(ValueError, match="at least 2"):
            parse_scale(bad)


def test_descriptors_and_memory_of_this_process():
    fds, sockets = descriptors()
    a, b = socket.socketpair()
    with a, b:
        assert descriptors() == (fds + 2, sockets + 2)
    assert rss_mib() > 1


def test_fd_limit_raised_up_to_the_hard_limit(monkeypatch):
    calls = []
    monkeypatch.setattr(resource, "getrlimit", lambda which: (100, 10_000))
    monkeypatch.setattr(resource, "setrlimit", lambda which, limits: calls.append(limits))
    assert fd_limit.ensure_fds(64) == fd_limit.fds_needed(64) > 100
    assert calls == [(fd_limit.fds_needed(64), 10_000)]
    calls.clear()
    assert fd_limit.ensure_fds(2) == 100 and calls == []  # enough already


def test_fd_limit_below_what_is_needed_names_both(monkeypatch):
    monkeypatch.setattr(resource, "getrlimit", lambda which: (100, 200))
    with pytest.raises(fd_limit.LimitTooLow) as error:
        fd_limit.ensure_fds(64)
    assert f"{fd_limit.fds_needed(64)} open file descriptors" in str(error.value)
    assert "RLIMIT_NOFILE" in str(error.value) and "hard limit is 200" in str(error.value)


@pytest.mark.parametrize("extra", [["--nproc", "4"], ["--compare", "gloo"], ["--netns", "2x2"]])
def test_scale_refuses_options_it_does_not_take(extra, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--scale", "4", *extra])
    assert stop.value.code == 2 and "--scale" in capsys.readouterr().err


def test_scale_shm_needs_scale(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--scale-shm"])
    assert "--scale-shm goes with --scale" in capsys.readouterr().err


# -- real runs ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs():
    """One real run at 4 and one at 8 ranks (tcp only), 5 timed all_reduces each."""
    return {n: run_ranks(n, iters=5, timeout=120, shm=False) for n in (4, 8)}


@pytest.mark.slow
def test_every_rank_reports_measured_values(runs):
    for n, run in runs.items():
        assert sorted(run["ranks"]) == list(range(n))
        summary = summarize(run)
        for key, _, _ in RANK_ROWS:
            row = summary["rows"][key]
            assert 0 < row["median"] <= row["max"], (n, key, row)
        rows = summary["rows"]
        assert rows["sockets_init"]["median"] >= n - 1  # one socket per peer, tcp only
        assert rows["fds_init"]["max"] >= rows["sockets_init"]["max"]
        parts = rows["store_connect_ms"]["max"], rows["records_ms"]["max"], rows["connections_ms"]["max"]
        assert rows["total_ms"]["max"] >= rows["init_ms"]["max"] and all(part > 0 for part in parts)


@pytest.mark.slow
def test_the_store_counts_every_rank_s_init_requests(runs):
    for n, run in runs.items():
        store = summarize(run)["store"]
        assert store["requests"]["set"] >= n  # every rank publishes its record
        assert store["requests"]["multi_get"] >= n and store["requests"]["add"] >= n  # records read, ranks counted in
        assert store["total"] == sum(store["requests"].values())
        assert store["peak_connections"] >= n and store["opened"] >= n and store["per_second"] > 0


@pytest.mark.slow
def test_the_table_has_a_row_per_quantity_and_two_columns_per_n(runs):
    summaries = [summarize(runs[n]) for n in (4, 8)]
    table = format_table(summaries, "# title", "pydist-bench --scale 4,8").splitlines()
    assert table[0] == "# title" and "N=4" in table[3] and "N=8" in table[3]
    assert table[4].split() == ["#", "quantity", "med", "max", "med", "max"]
    body = {line[:46].strip(): line[46:].split() for line in table[5:]}
    for _, label, _ in RANK_ROWS:
        cells = body[label]
        assert len(cells) == 4 and all(float(cell) >= 0 for cell in cells), (label, cells)
    for label in ("store requests during init", "  set", "store connections, peak", "store requests/s during init"):
        cells = body[label.strip()]
        assert len(cells) == 2 and all(float(cell) > 0 for cell in cells), (label, cells)


@pytest.mark.slow
def test_the_cli_prints_the_table_with_shared_memory_allowed():
    out = run_command(BENCH + ["--scale", "2", "--scale-shm", "--iters", "2"], timeout=120)
    assert out.returncode == 0, out.stderr
    assert "tcp + shared memory" in out.stdout and "= store/rendezvous ms" in out.stdout


@pytest.mark.slow
def test_the_cli_refuses_to_start_more_ranks_than_descriptors_allow():
    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (100, 100))
    out = subprocess.run(BENCH + ["--scale", "64"], capture_output=True, text=True, timeout=60, preexec_fn=low_limit,
                         env={**os.environ})
    assert out.returncode == 1 and out.stdout == ""
    assert f"{fd_limit.fds_needed(64)} open file descriptors" in out.stderr and "hard limit is 100" in out.stderr
    assert "starting" not in out.stderr
