"""pydist-run with several agents (nodes) on this host's loopback: c10d and static
rendezvous, node ranks, restarts counted for the whole job, nodes joining, the failure
report, signals reaching every agent, and the rendezvous' clear errors. (Separate hosts,
in network namespaces: tests/test_netns_multihost.py.)"""
from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import pytest
from test_launcher_run import WORKER, is_running, pids, run, start, tagged, wait_for_files  # noqa: F401 - pids is a fixture

from pydist.run.agent_rendezvous import NodeRecord, Rendezvous, RendezvousError, RendezvousSettings
from pydist.run.failure import WorkerExit
from pydist.store import HashStore
from pydist.testing import commands, free_port

pytestmark = pytest.mark.slow  # launchers and their workers

FAST = "join_timeout=20,last_call_timeout=0.5,read_timeout=10"


def c10d(port: int, nproc: int = 2, nnodes: str = "2", *extra: str) -> list[str]:
    return ["--nproc-per-node", str(nproc), "--nnodes", nnodes, "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "job", "--rdzv-conf", FAST,
            "--shutdown-timeout", "2", *extra]


def finish(procs, timeout: float = 60) -> list[tuple[int, str, str]]:
    """(returncode, stdout, stderr) of each launcher (see pydist.testing.commands.finish)."""
    return [(c.returncode, c.stdout, c.stderr) for c in commands.finish(procs, timeout)]


# --- the rendezvous alone, over an in-process store -------------------------------------

def _join_all(settings: RendezvousSettings, records: list[NodeRecord]) -> list:
    store, results = HashStore(), [None] * len(records)

    def join(i: int) -> None:
        try:
            results[i] = Rendezvous(store, settings, records[i]).join()
        except RendezvousError as exc:
            results[i] = exc

    threads = [threading.Thread(target=join, args=(i,)) for i in range(len(records))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_rendezvous_assigns_node_ranks_by_address():
    records = [NodeRecord(f"a{i}", f"h{i}", f"10.0.0.{9 - i}", 2, -1) for i in range(3)]
    rounds = _join_all(RendezvousSettings("j", 3, 3), records)
    assert [r.node_rank for r in rounds] == [2, 1, 0]
    assert {r.world_size for r in rounds} == {6} and {r.number for r in rounds} == {0}


def test_static_rendezvous_checks_node_ranks_and_nproc():
    ranks = _join_all(RendezvousSettings("j", 2, 2, static=True),
                      [NodeRecord("a", "h1", "x", 2, 1), NodeRecord("b", "h2", "y", 2, 0)])
    assert [r.node_rank for r in ranks] == [1, 0]
    twice = _join_all(RendezvousSettings("j", 2, 2, static=True),
                      [NodeRecord("a", "h1", "x", 2, 0), NodeRecord("b", "h2", "y", 2, 0)])
    assert all("--node-rank values must be 0..1" in str(e) for e in twice)
    mismatch = _join_all(RendezvousSettings("j", 2, 2), [NodeRecord("a", "h1", "x", 2, -1),
                                                         NodeRecord("b", "h2", "y", 3, -1)])
    assert all("mismatched --nproc-per-node across nodes (h1 (x): 2, h2 (y): 3)" in str(e) for e in mismatch)


def test_members_of_a_refused_round_leave_it_so_the_store_host_waits_for_them():
    """Every member refuses a round with mismatched --nproc-per-node and records that it left,
    so the agent hosting the store can wait for the others before closing it (else a slower
    member loses the store before it has read why)."""
    store = HashStore()
    settings = RendezvousSettings("j", 2, 2, last_call=0.1)
    refused = [Rendezvous(store, settings, NodeRecord(f"a{i}", f"h{i}", "x", 1 + i, -1)) for i in range(2)]
    errors: list[RendezvousError] = []

    def join(rdzv: Rendezvous) -> None:
        with pytest.raises(RendezvousError, match="mismatched --nproc-per-node") as raised:
            rdzv.join()
        errors.append(raised.value)

    threads = [threading.Thread(target=join, args=(rdzv,)) for rdzv in refused]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert [(e.round_number, e.members) for e in errors] == [(0, 2), (0, 2)]
    assert refused[0].wait_left(0, 2, timeout=0)


def test_rendezvous_too_few_nodes_names_who_came():
    started = time.monotonic()
    [error] = _join_all(RendezvousSettings("j", 2, 2, join_timeout=0.5), [NodeRecord("a", "h1", "x", 1, -1)])
    assert isinstance(error, RendezvousError) and time.monotonic() - started >= 0.45  # its join timeout, waited
    assert "timed out after 0.5s: 1 of at least 2 nodes joined (h1 (x))" in str(error)


def test_a_late_node_stops_the_running_round_and_both_meet_in_the_next():
    store = HashStore()
    settings = RendezvousSettings("j", 1, 2, last_call=0.1)
    first = Rendezvous(store, settings, NodeRecord("a", "h1", "x", 1, -1))
    assert first.join().nnodes == 1
    late = Rendezvous(store, settings, NodeRecord("b", "h2", "y", 1, -1))
    joined = []
    thread = threading.Thread(target=lambda: joined.append(late.join()))
    thread.start()
    deadline = time.monotonic() + 10
    while first.stop_record(0) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert first.stop_record(0) == {"reason": "join", "host": "h2 (y)"}
    again = first.join()
    thread.join(10)
    assert again.number == joined[0].number == 1 and again.nnodes == 2


def test_only_the_first_failure_uses_a_restart():
    rdzv = Rendezvous(HashStore(), RendezvousSettings("j", 1, 1), NodeRecord("a", "h", "x", 1, -1))

    def failure(rank: int) -> dict:
        return {"reason": "failure", "exit": WorkerExit(rank, rank, 100 + rank, 1, 0.0, 0.0).to_json()}

    first = rdzv.request_stop(0, failure(1))
    second = rdzv.request_stop(0, failure(2))
    assert first == second == {**failure(1), "restarts_used": 0}
    assert rdzv.request_stop(1, failure(0))["restarts_used"] == 1


# --- real agents on loopback ------------------------------------------------------------

def test_two_nodes_c10d_share_one_job(pids):
    port = free_port()
    procs = [start(c10d(port, 2, "2", WORKER, "rendezvous"), pids) for _ in range(2)]
    results = finish(procs)
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    values = {}
    for _, out, _ in results:
        values.update({rank: found["values"] for rank, found in tagged(out, "STORE").items()})
    assert values == {r: [f"value{i}" for i in range(4)] for r in range(4)}
    assert all("of 2 (" in err for _, _, err in results)


def test_static_two_nodes_with_node_ranks(pids):
    port = free_port()
    procs = [start(["--nproc-per-node", "1", "--nnodes", "2", "--node-rank", str(n), "--master-port", str(port),
                    WORKER, "env"], pids) for n in (1, 0)]
    results = finish(procs)
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    envs = [tagged(out, "ENV") for _, out, _ in results]
    assert envs[0][1]["GROUP_RANK"] == "1" and envs[1][0]["GROUP_RANK"] == "0"
    assert envs[0][1]["WORLD_SIZE"] == envs[1][0]["WORLD_SIZE"] == "2"


def test_failure_restarts_every_node_once_and_names_rank_and_host(pids):
    port = free_port()
    procs = [start(c10d(port, 2, "2", "--max-restarts", "1", WORKER, "flaky", "3"), pids) for _ in range(2)]
    results = finish(procs)
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    for _, out, err in results:
        assert "restarting the job (1 of 1 restarts)" in err
        assert "rank      : 3 (local_rank: 1)" in err and "error     : ValueError: boom from rank 3" in err
        counts = {env["TORCHELASTIC_RESTART_COUNT"] for env in tagged(out, "ENV").values()}
        assert counts == {"1"}  # the last line per rank is from the second round


def test_failure_without_restarts_fails_every_node(pids):
    port = free_port()
    procs = [start(c10d(port, 1, "2", WORKER, "flaky", "0"), pids) for _ in range(2)]
    results = finish(procs)
    assert [code for code, _, _ in results] == [1, 1]
    for _, _, err in results:
        assert "Root Cause (first observed failure)" in err and "rank      : 0 (local_rank: 0)" in err
        assert "ValueError: boom from rank 0" in err


def test_signal_to_one_launcher_stops_every_node(pids):
    port = free_port()
    procs = [start(c10d(port, 1, "2", WORKER, "sleep"), pids) for _ in range(2)]
    wait_for_files(pids[0], {"0", "1"})
    procs[1].send_signal(signal.SIGTERM)
    results = finish(procs, timeout=20)
    assert [code for code, _, _ in results] == [143, 143], [err for _, _, err in results]
    assert "got SIGTERM; stopping the workers" in results[1][2]
    assert "got SIGTERM; stopped" in results[0][2]


def test_a_node_joining_starts_a_new_round(pids):
    port = free_port()
    first = start(c10d(port, 1, "1:2", WORKER, "until-world", "2"), pids)
    wait_for_files(pids[0], {"0"})
    second = start(c10d(port, 1, "1:2", WORKER, "until-world", "2"), pids)
    results = finish([first, second])
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    assert "joins the job: starting a new round" in results[0][2]
    worlds = {env["WORLD_SIZE"] for _, out, _ in results for env in tagged(out, "ENV").values()}
    assert "2" in worlds


@pytest.mark.parametrize("args, message", [
    (["--nnodes", "2", "--rdzv-conf", "join_timeout=1"], "1 of at least 2 nodes joined"),
    (["--nnodes", "2", "--node-rank", "1", "--master-port", "1", "--rdzv-conf", "read_timeout=1"],
     "cannot reach the rendezvous endpoint 127.0.0.1:1"),
])
def test_rendezvous_errors_are_clear(args, message, pids):
    result, seconds = run([*args, WORKER, "env"], pids[0], timeout=90)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert seconds < 40  # by the 1 s timeout asked for, not the defaults (join 600 s, read 60 s); generous: load


def test_mismatched_nproc_is_refused_on_every_node(pids):
    port = free_port()
    results = finish([start(c10d(port, n, "2", WORKER, "env"), pids) for n in (1, 2)])
    for code, _, err in results:
        assert code == 1 and "mismatched --nproc-per-node across nodes" in err, err


# --- output, logs, error records --------------------------------------------------------

def test_exception_reaches_the_report_without_a_decorator(pids):
    result, _ = run(["--nproc-per-node", "2", WORKER, "fail", "raise", "1"], pids[0])
    assert result.returncode == 1
    assert "error     : ValueError: boom from rank 1" in result.stderr
    assert 'raise ValueError(f"boom from rank {rank}")' in result.stderr


def test_log_dir_redirects_tee_and_filter(pids, tmp_path: Path):
    logs = tmp_path / "logs"
    result, _ = run(["--nproc-per-node", "2", "--log-dir", str(logs), "--rdzv-id", "j", "-r", "0:1", "-t", "1:2",
                     "--local-ranks-filter", "1", WORKER, "echo", "x"], pids[0])
    assert result.returncode == 0, result.stderr
    attempt = logs / "j" / "attempt_0"
    assert "ARGS" in (attempt / "0" / "stdout.log").read_text()  # redirected: file only
    assert "to stderr from 1" in (attempt / "1" / "stderr.log").read_text()  # tee'd: file and console
    assert "[rank1]:to stderr from 1" in result.stderr
    assert "[rank0]" not in result.stdout + result.stderr  # filtered out
    assert not (attempt / "1" / "stdout.log").exists()


def test_run_path(pids, tmp_path: Path):
    result, _ = run(["--nproc-per-node", "1", "--run-path", WORKER, "echo", "y"], pids[0])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.split("ARGS ", 1)[1].splitlines()[0]) == ["y"]


def test_killed_launcher_takes_its_workers_along(pids):
    proc = start(["--nproc-per-node", "2", WORKER, "sleep"], pids)
    wait_for_files(pids[0], {"0", "1"})
    workers = [int((pids[0] / name).read_text()) for name in ("0", "1")]
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while any(is_running(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(is_running(pid) for pid in workers)
