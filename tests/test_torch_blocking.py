"""torch's blocking calls (``opts.asyncOp`` False: torch 2.8 and later set it, then wait on the
Work at once) run in the caller's thread, as pydist's own blocking calls, raise their error
there and return no Work (torch's functions take that as synced), or a finished one where
torch keeps the Works as graph inputs; async ones (``asyncOp`` True, and the options C++
callers make: DDP's buckets) stay queued, off the caller's thread (issue 49). The one-rank
groups here have no progress thread: only a waiter, or a blocking call, runs what is queued."""
from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as tdist  # noqa: E402
from test_group_queue_wait import crossed_calls  # noqa: E402
from torch._C import _distributed_c10d as c10d  # noqa: E402

from pydist.core.errors import DistBackendError  # noqa: E402
from pydist.groups.queue import OpQueue  # noqa: E402
from pydist.testing import run_processes  # noqa: E402


@pytest.fixture
def plugin(monkeypatch):
    """A one-rank torch world on pydist whose queued calls only waiters run (no progress thread)."""
    import pydist.torch  # noqa: F401 - registers the backend
    monkeypatch.setattr(OpQueue, "_start_thread", lambda self: None)
    tdist.init_process_group("pydist", store=tdist.HashStore(), rank=0, world_size=1)
    group = tdist.distributed_c10d._get_default_group()
    try:
        yield group
    finally:
        monkeypatch.undo()
        group.pydist_group._queue._start_thread()  # runs what a failed test left queued
        tdist.destroy_process_group()


def _options(kind: str, asyncop: bool, **fields):
    opts = getattr(c10d, kind)()
    opts.asyncOp = asyncop
    for name, value in fields.items():
        setattr(opts, name, value)
    return opts


def _calls(asyncop: bool) -> dict:
    """Each collective through the plugin's method, as torch calls it: (call, its check)."""
    one, two = torch.tensor([3.0]), torch.zeros(1)
    gathered, scattered = torch.zeros(1), torch.zeros(1)
    return {
        "allreduce": (lambda pg: pg.allreduce([one], _options("AllreduceOptions", asyncop)),
                      lambda: one.tolist() == [3.0]),
        "broadcast": (lambda pg: pg.broadcast([one], _options("BroadcastOptions", asyncop, rootRank=0)),
                      lambda: one.tolist() == [3.0]),
        "barrier": (lambda pg: pg.barrier(_options("BarrierOptions", asyncop)), lambda: True),
        "all_gather_into_tensor": (
            lambda pg: pg._allgather_base(gathered, torch.tensor([5.0]), _options("AllgatherOptions", asyncop)),
            lambda: gathered.tolist() == [5.0]),
        "reduce_scatter_tensor": (
            lambda pg: pg._reduce_scatter_base(scattered, torch.tensor([6.0]),
                                               _options("ReduceScatterOptions", asyncop)),
            lambda: scattered.tolist() == [6.0]),
        "reduce": (lambda pg: pg.reduce([two], _options("ReduceOptions", asyncop, rootRank=0)),
                   lambda: two.tolist() == [0.0]),
    }


@pytest.mark.parametrize("name", list(_calls(False)))
def test_a_blocking_call_has_run_when_the_backend_returns(plugin, name):
    call, check = _calls(False)[name]
    assert call(plugin) is None and check()


@pytest.mark.parametrize("name", list(_calls(False)))
def test_a_blocking_call_returns_a_finished_work_where_torch_keeps_works(plugin, name):
    """Inside ``allow_inflight_collective_as_graph_input_ctx`` torch registers each call's Work
    for a later ``wait_tensor``: the Work is there, done."""
    from torch.distributed._functional_collectives import allow_inflight_collective_as_graph_input_ctx

    call, check = _calls(False)[name]
    with allow_inflight_collective_as_graph_input_ctx():
        work = call(plugin)
    assert work.is_completed() and work.is_success() and work.exception() is None and check()
    assert work.wait() is True and work.get_future().wait() is not None


@pytest.mark.parametrize("name", list(_calls(True)))
def test_an_async_call_stays_queued_until_waited_on(plugin, name):
    call, check = _calls(True)[name]
    work = call(plugin)
    assert not work.is_completed()
    assert work.wait() is True and work.is_completed() and check()


def test_a_call_with_torchs_default_options_is_async(plugin):
    """C++ callers (DDP's reducer, functional collectives) make options whose asyncOp is True."""
    work = plugin.allreduce([torch.ones(1)], c10d.AllreduceOptions())
    assert not work.is_completed()
    work.wait()


def test_a_blocking_call_runs_after_the_calls_queued_before_it_in_this_thread(plugin):
    engine = plugin.pydist_group.engine
    ran: list = []
    original = engine.all_reduce

    def recording(ctx, *args):
        ran.append((ctx.seq, threading.current_thread()))
        return original(ctx, *args)
    engine.all_reduce = recording
    first = plugin.allreduce([torch.ones(1)], _options("AllreduceOptions", True))
    assert ran == []
    plugin.allreduce([torch.ones(1)], _options("AllreduceOptions", False))
    assert first.is_completed()
    assert [seq for seq, _ in ran] == sorted(seq for seq, _ in ran) and len(ran) == 2
    assert {thread for _, thread in ran} == {threading.current_thread()}


def test_a_failed_blocking_call_raises_its_error_at_the_call(plugin):
    plugin.pydist_group.state.fail(DistBackendError("an earlier failure"))
    with pytest.raises(DistBackendError, match="is broken: an earlier operation failed"):
        plugin.allreduce([torch.ones(1)], _options("AllreduceOptions", False))
    with pytest.raises(DistBackendError, match="is broken"):
        tdist.all_reduce(torch.ones(1))  # torch's function: the error of its call


def test_a_misused_blocking_call_raises_from_torchs_function(plugin):
    with pytest.raises(TypeError, match="ReduceOp.BAND is a bitwise op and needs an integer or bool tensor"):
        tdist.all_reduce(torch.ones(2), op=tdist.ReduceOp.BAND)


@pytest.mark.slow
def test_a_torch_async_call_does_not_wait_for_peers_in_the_callers_thread():
    assert run_processes(2, crossed_calls, "torch", init="torch", timeout=120) == [([3.0] * 2, [30.0] * 2)] * 2


def test_options_without_async_op_run_as_async_calls(plugin):
    """A torch whose options have no ``asyncOp`` (before 2.8): every call takes the async path,
    which was every call's path before issue 49."""
    class OldOptions:
        reduceOp = tdist.ReduceOp.SUM
    one = torch.tensor([3.0])
    work = plugin.allreduce([one], OldOptions())
    assert not work.is_completed()
    assert work.wait() is True and one.tolist() == [3.0]
