"""pydist.debug: the flight recorder (ring buffer per group, trace files on failure and at
destroy, ``python -m pydist.debug DIR``) and the timeline (PYDIST_TIMELINE)."""
from __future__ import annotations

import json
import os
import pickle
import sys
import time

import numpy as np
import pytest

import pydist
from pydist.debug import analyze, dump_traces, traces
from pydist.testing import run_processes, run_threads
from pydist.testing.commands import run_command

F32 = np.float32
DEBUG_VARS = ("PYDIST_TRACE_DIR", "PYDIST_TIMELINE", "PYDIST_TRACE_BUFFER", "PYDIST_DEBUG")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in DEBUG_VARS:
        monkeypatch.delenv(name, raising=False)


def analyzer(directory) -> str:
    """``python -m pydist.debug DIR``'s output (it must succeed)."""
    done = run_command([sys.executable, "-m", "pydist.debug", str(directory)], timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def entries(snapshot: dict, group: int = 0) -> list[dict]:
    return snapshot["groups"][group]["entries"]


# -- the ring buffer ----------------------------------------------------------------------

def _many_all_reduces(rank: int, size: int, count: int) -> list[dict]:
    t = np.ones(4, F32)
    for _ in range(count):
        pydist.all_reduce(t)
    return traces(rank)


def test_ring_buffer_keeps_the_last_n(monkeypatch):
    monkeypatch.setenv("PYDIST_TRACE_BUFFER", "5")
    snapshot = run_threads(2, _many_all_reduces, 12)[1][0]
    group = snapshot["groups"][0]
    assert (group["capacity"], group["recorded"]) == (5, 12)
    assert [e["seq"] for e in group["entries"]] == [8, 9, 10, 11, 12]
    assert all(e["state"] == "completed" and e["op"] == "all_reduce" for e in group["entries"])
    assert (snapshot["rank"], snapshot["world_size"]) == (1, 2)


def test_buffer_zero_turns_the_recorder_off(monkeypatch):
    monkeypatch.setenv("PYDIST_TRACE_BUFFER", "0")
    assert run_threads(2, _many_all_reduces, 3) == [[], []]


def _every_collective(rank: int, size: int) -> list[dict]:
    """Every collective once (object ones included), with rank-dependent sizes where torch
    allows them; returns this rank's recorded entries."""
    t = np.arange(6, dtype=F32)
    parts = [np.zeros(6, F32) for _ in range(size)]
    pydist.broadcast(t, src=1)
    pydist.all_reduce(t, op=pydist.ReduceOp.MAX)
    pydist.reduce(t, dst=2, op=pydist.ReduceOp.PRODUCT)
    pydist.all_gather(parts, t)
    pydist.all_gather_into_tensor(np.zeros(6 * size, F32), t)
    pydist.gather(t, parts if rank == 0 else None, dst=0)
    pydist.gather(t[:4].astype(np.int32), [np.zeros(4, np.int32) for _ in range(size)] if rank == 2 else None, dst=2)
    pydist.scatter(t, parts if rank == 1 else None, src=1)
    pydist.reduce_scatter(t, parts)
    pydist.reduce_scatter_tensor(t, np.zeros(6 * size, F32), op=pydist.ReduceOp.MIN)
    pydist.all_to_all([np.zeros(6, np.int64) for _ in range(size)], [np.ones(6, np.int64) for _ in range(size)])
    sent = [rank + j for j in range(size)]  # rows rank sends to j; rank j sends rank i rows j + i
    pydist.all_to_all_single(np.zeros(sum(j + rank for j in range(size)), F32), np.ones(sum(sent), F32),
                             output_split_sizes=[j + rank for j in range(size)], input_split_sizes=sent)
    pydist.gather_object({"rank": rank}, [None] * size if rank == 1 else None, dst=1)
    pydist.barrier()
    pydist.all_reduce(t, async_op=True).wait()
    return entries(traces(rank)[0])


def _expected_calls(rank: int, size: int) -> list[tuple]:
    """(seq, op, dtype, count, root, reduce_op, async_op) of every entry _every_collective
    records on ``rank``: count is what the recorder documents per collective."""
    mine = len(pickle.dumps({"rank": rank}))
    return [
        (1, "broadcast", "float32", 6, 1, None, False),
        (2, "all_reduce", "float32", 6, None, "MAX", False),
        (3, "reduce", "float32", 6, 2, "PRODUCT", False),
        (4, "all_gather", "float32", 6, None, None, False),
        (5, "all_gather_into_tensor", "float32", 6, None, None, False),
        (6, "gather", "float32", 6, 0, None, False),
        (7, "gather", "int32", 4, 2, None, False),
        (8, "scatter", "float32", 6, 1, None, False),
        (9, "reduce_scatter", "float32", 6, None, "SUM", False),
        (10, "reduce_scatter_tensor", "float32", 6, None, "MIN", False),
        (11, "all_to_all", "int64", 6 * size, None, None, False),
        (12, "all_to_all_single", "float32", sum(rank + j for j in range(size)), None, None, False),
        (13, "gather", "int64", 1, 1, None, False),  # gather_object: the sizes, then the pickles
        (14, "gather_object", "uint8", mine, 1, None, False),
        (15, "barrier", None, 0, None, None, False),
        (16, "all_reduce", "float32", 6, None, "SUM", True),
    ]


#: the engine's algorithm per op: ranks sharing memory, and one rank per host (3 ranks, small)
SHM = "shm"
NETWORK = {"broadcast": "binomial", "all_reduce": "recursive_doubling", "reduce": "binomial",
           "all_gather": "bruck", "all_gather_into_tensor": "bruck", "gather": "linear", "gather_object": "linear",
           "scatter": "linear", "reduce_scatter": "recursive_doubling",
           "reduce_scatter_tensor": "recursive_doubling", "all_to_all": "pairwise",
           "all_to_all_single": "pairwise", "barrier": "dissemination"}


@pytest.mark.parametrize("where", ["one host", "three hosts"])
def test_every_collective_is_recorded_with_its_call_at_every_rank(where):
    hosts = None if where == "one host" else ["a", "b", "c"]
    recorded = run_threads(3, _every_collective, transport="tcp", hosts=hosts)
    for rank, got in enumerate(recorded):
        calls = [(e["seq"], e["op"], e["dtype"], e["count"], e["root"], e["reduce_op"], e["async_op"]) for e in got]
        assert calls == _expected_calls(rank, 3), rank
        assert all(e["state"] == "completed" and e["error"] is None and e["call_site"] is None for e in got)
        assert [e["algorithm"] for e in got] == [SHM if hosts is None else NETWORK[e["op"]] for e in got]
        itemsizes = {"float32": 4, "int32": 4, "int64": 8, "uint8": 1, None: 0}
        assert [e["bytes"] for e in got] == [e["count"] * itemsizes[e["dtype"]] for e in got]
        for e in got:
            assert e["time_queued"] <= e["time_started"] <= e["time_finished"]
            assert e["mono_queued"] <= e["mono_started"] <= e["mono_finished"]


def _one_call(rank: int, size: int) -> str | None:
    pydist.all_reduce(np.ones(2, F32))
    return entries(traces(rank)[0])[0]["call_site"]


def test_call_sites_only_with_pydist_debug_detail(monkeypatch):
    assert run_threads(2, _one_call) == [None, None]
    monkeypatch.setenv("PYDIST_DEBUG", "detail")
    sites = run_threads(2, _one_call)
    assert all(site.startswith(__file__) and site.endswith("in _one_call") for site in sites), sites


def test_torchs_detail_debug_level_turns_call_sites_on_too():
    try:
        pydist.set_debug_level(pydist.DebugLevel.DETAIL)
        sites = run_threads(2, _one_call)
    finally:
        pydist.set_debug_level_from_env()
    assert all(site.endswith("in _one_call") for site in sites), sites


# -- files on failure, and the analyzer ----------------------------------------------------

def _skips_the_last_op(rank: int, size: int) -> str:
    """Every rank runs 2 all_reduces but rank 1, which skips the second (and stays alive
    while the others time out)."""
    t = np.ones(8, F32)
    pydist.all_reduce(t)
    if rank == 1:
        time.sleep(4.0)
        return "skipped"
    try:
        pydist.all_reduce(t)
    except pydist.DistError as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


@pytest.mark.slow
def test_timeout_writes_every_rank_and_the_analyzer_names_the_rank_behind(tmp_path):
    outcome = run_processes(3, _skips_the_last_op, pg_timeout=1.0, timeout=90,
                            env={"PYDIST_TRACE_DIR": str(tmp_path)})
    assert outcome[1] == "skipped" and all(text.startswith(("OpTimeoutError", "DistBackendError", "GroupAborted"))
                                           for text in (outcome[0], outcome[2])), outcome
    files = sorted(os.listdir(tmp_path))
    assert files == [f"pydist_trace_rank{r}.json" for r in range(3)]
    for rank in range(3):
        with open(tmp_path / files[rank]) as file:
            trace = json.load(file)
        assert (trace["rank"], trace["world_size"], trace["pid"] > 0, bool(trace["host"])) == (rank, 3, True, True)
    assert json.loads((tmp_path / files[0]).read_text())["first_failure"]
    text = analyzer(tmp_path)
    assert "BEHIND: rank 1 never reached seq 2 all_reduce(float32, 8, SUM) (started by ranks 0, 2)" in text, text
    assert "FAILED: rank 0 seq 2 all_reduce(float32, 8, SUM):" in text, text
    assert "MISMATCH" not in text, text


def _mismatched(rank: int, size: int) -> str:
    t = np.ones(8, F32)
    pydist.all_reduce(t)
    try:
        if rank == 1:
            pydist.all_gather([np.zeros(8, F32) for _ in range(size)], t)
        else:
            pydist.all_reduce(t)
    except pydist.DistError as error:
        return type(error).__name__
    return "no error"


@pytest.mark.slow
def test_mismatched_calls_named_by_the_analyzer(tmp_path, monkeypatch):
    monkeypatch.setenv("PYDIST_TRACE_DIR", str(tmp_path))
    run_threads(3, _mismatched, pg_timeout=3.0, timeout=60)
    text = analyzer(tmp_path)
    assert ("MISMATCH: rank 1 called all_gather(float32, 8) at seq 2 while ranks 0, 2 called "
            "all_reduce(float32, 8, SUM)") in text, text


def _trace(rank: int, calls: list[tuple], members=(0, 1, 2)) -> dict:
    """A synthetic trace file: ``calls`` = (seq, op, dtype, count, reduce_op, state)."""
    entries = [{"seq": seq, "op": op, "dtype": dtype, "count": count, "root": None, "reduce_op": reduce_op,
                "state": state, "error": "DistBackendError: timed out" if state == "failed" else None,
                "mono_started": 1.0} for seq, op, dtype, count, reduce_op, state in calls]
    return {"rank": rank, "host": "h", "pid": rank, "reason": "test", "mono_dumped": 2.0,
            "groups": [{"name": "default_pg", "ranks": list(members), "entries": entries}]}


def test_analyzer_from_traces_alone():
    ok = [(1, "all_reduce", "float32", 8, "SUM", "completed")]
    traces_ = [_trace(0, ok + [(2, "all_reduce", "float32", 8, "SUM", "failed")]),
               _trace(1, ok + [(2, "all_gather", "float32", 8, None, "started")]),
               _trace(2, ok)]
    report = analyze.format_report(traces_, analyze.analyze(traces_))
    assert "MISMATCH: rank 1 called all_gather(float32, 8) at seq 2 while rank 0 called " \
           "all_reduce(float32, 8, SUM)" in report, report
    assert ("BEHIND: rank 2 never reached seq 2 all_reduce(float32, 8, SUM) (started by rank 0); "
            "all_gather(float32, 8) (started by rank 1); "
            "its last was seq 1 all_reduce(float32, 8, SUM)") in report, report
    assert "STUCK: rank 1 is in seq 2 all_gather(float32, 8), started 1.0 s before its trace was written" in report
    assert "FAILED: rank 0 seq 2 all_reduce(float32, 8, SUM): DistBackendError: timed out" in report
    consistent = [_trace(r, ok, members=(0, 1)) for r in range(2)]
    assert "consistent" in analyze.format_report(consistent, analyze.analyze(consistent))
    partial = [_trace(0, ok)]
    assert "NO TRACE from ranks 1, 2" in analyze.format_report(partial, analyze.analyze(partial))
    twice = []  # two groups of one name (the torch plugin's "torch"): matched by creation order
    for rank in range(2):
        trace = _trace(rank, ok, members=(0, 1))
        trace["groups"].append(_trace(rank, [(1, "broadcast", "int64", 2, None, "completed")])["groups"][0])
        twice.append(trace)
    assert [(r.name, r.healthy) for r in analyze.analyze(twice)] == [("default_pg", True), ("default_pg#2", False)]


@pytest.mark.slow
def test_analyzer_needs_files(tmp_path):
    done = run_command([sys.executable, "-m", "pydist.debug", str(tmp_path)], timeout=60)
    assert done.returncode == 2 and "no pydist_trace_rank" in done.stderr


def _dump_on_demand(rank: int, size: int, directory: str) -> list[str]:
    pydist.all_reduce(np.ones(3, F32))
    return dump_traces(directory, rank=rank)


def test_dump_traces_on_demand(tmp_path):
    paths = run_threads(2, _dump_on_demand, str(tmp_path))
    assert paths == [[str(tmp_path / f"pydist_trace_rank{r}.json")] for r in range(2)]
    trace = json.loads((tmp_path / "pydist_trace_rank0.json").read_text())
    assert trace["reason"] == "on demand" and entries(trace)[0]["op"] == "all_reduce"
    with pytest.raises(ValueError, match="PYDIST_TRACE_DIR"):
        dump_traces()


def _fails(rank: int, size: int) -> str:
    pydist.all_reduce(np.ones(2, F32))
    if rank == 0:
        try:
            pydist.all_reduce(np.ones(2, F32))
        except pydist.DistError as error:
            return type(error).__name__
    return "ok"


def test_nothing_written_without_the_variables(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_threads(2, _fails, pg_timeout=0.5)[0] != "ok"
    assert os.listdir(tmp_path) == []


# -- the timeline ---------------------------------------------------------------------------

def _timeline_ops(rank: int, size: int) -> None:
    t = np.ones(16, F32)
    pydist.all_reduce(t)
    works = [pydist.broadcast(t, src=0, async_op=True), pydist.all_reduce(t, async_op=True)]
    for work in works:
        work.wait()
    pair = pydist.new_group([0, 1])
    pydist.barrier(group=pair)


def test_timeline_is_chrome_trace_json_with_every_op(tmp_path, monkeypatch):
    monkeypatch.setenv("PYDIST_TIMELINE", str(tmp_path / "timeline-{rank}.json"))
    run_threads(2, _timeline_ops)
    for rank in range(2):
        events = json.loads((tmp_path / f"timeline-{rank}.json").read_text())
        assert {e["pid"] for e in events} == {rank}
        names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
        assert names and all(name.startswith(f"rank {rank} (") for name in names)
        ops = [e for e in events if e["ph"] == "X"]
        assert [(e["name"], e["args"]["seq"], e["tid"]) for e in ops] == [
            ("all_reduce", 1, 0), ("broadcast", 2, 0), ("all_reduce", 3, 0), ("barrier", 1, 1)]
        for event in ops:
            assert event["dur"] >= 0 and event["args"]["algorithm"] and event["args"]["state"] == "completed"
            assert {"group", "seq", "bytes", "count", "queued_us", "async_op"} <= event["args"].keys()
        assert [e["args"].get("dtype") for e in ops] == ["float32"] * 3 + [None]
        assert ops[0]["args"]["bytes"] == 64 and ops[0]["args"]["reduce_op"] == "SUM"
        assert ops[1]["args"]["root"] == 0 and ops[1]["args"]["async_op"]
        queued = [e for e in events if e.get("cat") == "queue"]  # waits of 10 us or more
        assert queued and [e["ph"] for e in queued] == ["b", "e"] * (len(queued) // 2)
        for begin, end in zip(queued[::2], queued[1::2]):
            assert begin["id"] == end["id"] and begin["ts"] <= end["ts"] and begin["name"].endswith(" queued")
        assert "all_reduce queued" in {e["name"] for e in queued}  # the 2nd async op waited for the 1st
        threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
        assert threads[0].startswith("group default_pg") and threads[1].startswith("group pg")


def test_timeline_describes_every_collective_as_the_recorder_does(tmp_path, monkeypatch):
    monkeypatch.setenv("PYDIST_TIMELINE", str(tmp_path / "timeline-{rank}.json"))
    recorded = run_threads(3, _every_collective, transport="tcp", hosts=["a", "b", "c"])
    for rank, got in enumerate(recorded):
        events = json.loads((tmp_path / f"timeline-{rank}.json").read_text())
        ops = [e for e in events if e["ph"] == "X" and e["tid"] == 0]
        assert [(e["name"], e["args"]["seq"], e["args"].get("dtype"), e["args"]["count"], e["args"]["bytes"],
                 e["args"].get("root"), e["args"].get("reduce_op"), e["args"]["algorithm"], e["args"]["async_op"])
                for e in ops] == [(e["op"], e["seq"], e["dtype"], e["count"], e["bytes"], e["root"], e["reduce_op"],
                                   e["algorithm"], e["async_op"]) for e in got], rank


def test_timeline_without_rank_placeholder_and_reinit_appends(tmp_path, monkeypatch):
    monkeypatch.setenv("PYDIST_TIMELINE", str(tmp_path / "tl.json"))
    run_threads(2, _many_all_reduces, 2)
    run_threads(2, _many_all_reduces, 3)
    events = json.loads((tmp_path / "tl.json.rank1.json").read_text())
    assert [e["args"]["seq"] for e in events if e["ph"] == "X"] == [1, 2, 1, 2, 3]


def test_analyzer_says_once_when_and_why_each_file_was_written():
    failure = "DistBackendError: timed out [all_reduce seq 2 on group default_pg]"
    reasons = [("exit after a failure", failure), ("exit", None), (failure, failure), ("on demand", failure)]
    traces_ = [{**_trace(rank, []), "reason": reason, "first_failure": first} for rank, (reason, first)
               in enumerate(reasons)]
    lines = analyze.format_report(traces_, analyze.analyze(traces_)).splitlines()[1:5]
    assert lines == ["  rank 0: h pid 0, written on exit after a failure",
                     "  rank 1: h pid 1, written on exit",
                     f"  rank 2: h pid 2, written when it failed: {failure}",
                     "  rank 3: h pid 3, written on demand, after a failure"]
