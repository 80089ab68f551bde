"""torch's profiler shows the plugin's communication as it shows gloo's: one asynchronous
event "<backend>:<op>" per operation, with the input tensors' shapes. Each program runs at
2 ranks with a gloo group and a pydist group side by side, and their events are compared."""
import pytest

from pydist.testing import run_processes

torch = pytest.importorskip("torch")
import torch.distributed as tdist  # noqa: E402

pytestmark = pytest.mark.slow
BACKENDS = ("gloo", "pydist")
TIMEOUT = 120  # generous (under the per-test timeout): the programs take a few seconds


def _ops(rank: int, group) -> dict:
    """{label: a call of one operation on ``group``}, each with distinct shapes."""
    peer = 1 - rank
    t = torch.ones(3, 2)
    return {
        "all_reduce": lambda: tdist.all_reduce(t, group=group),
        "all_reduce async": lambda: tdist.all_reduce(t, group=group, async_op=True).wait(),
        "all_reduce complex": lambda: tdist.all_reduce(torch.ones(5, dtype=torch.complex64), group=group),
        "all_reduce sparse": lambda: tdist.all_reduce(torch.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (3,)),
                                                      group=group),
        "all_reduce_coalesced": lambda: tdist.all_reduce_coalesced([t, torch.ones(4)], group=group),
        "broadcast": lambda: tdist.broadcast(t, src=0, group=group),
        "reduce": lambda: tdist.reduce(t, dst=0, group=group),
        "all_gather": lambda: tdist.all_gather([torch.empty(3, 2) for _ in range(2)], t, group=group),
        "all_gather_coalesced": lambda: tdist.all_gather_coalesced([[torch.empty(3, 2)] for _ in range(2)], [t],
                                                                   group=group),
        "all_gather_into_tensor": lambda: tdist.all_gather_into_tensor(torch.empty(6, 2), t, group=group),
        "gather": lambda: tdist.gather(t, [torch.empty(3, 2) for _ in range(2)] if rank == 0 else None, dst=0,
                                       group=group),
        "scatter": lambda: tdist.scatter(t, [torch.ones(3, 2) for _ in range(2)] if rank == 0 else None, src=0,
                                         group=group),
        "all_to_all_single": lambda: tdist.all_to_all_single(torch.empty(4), torch.ones(4), group=group),
        "all_to_all": lambda: tdist.all_to_all([torch.empty(2), torch.empty(2)], [torch.ones(2), torch.ones(2)],
                                               group=group),
        "barrier": lambda: tdist.barrier(group=group),
        "send/recv": lambda: (tdist.send(t, dst=1, group=group) if rank == 0
                              else tdist.recv(t, src=0, group=group)),
        "recv any source": lambda: (tdist.send(torch.ones(7), dst=1, group=group) if rank == 0
                                    else tdist.recv(torch.empty(7), group=group)),
        "isend/irecv": lambda: [work.wait() for work in tdist.batch_isend_irecv(
            [tdist.P2POp(tdist.isend, t, peer, group), tdist.P2POp(tdist.irecv, torch.empty(3, 2), peer, group)])],
        "reduce_scatter_tensor": lambda: tdist.reduce_scatter_tensor(torch.empty(2), torch.ones(4), group=group),
    }


def _events(backend: str, profile) -> list:
    """(op title, is_async, input shapes, count) of the backend's events."""
    prefix = f"{backend}:"
    return [(event.name[len(prefix):], event.is_async, event.input_shapes, event.count)
            for event in profile.function_events if event.name.startswith(prefix)]


def _profile_every_op(rank: int, size: int) -> dict:
    """{backend: {label: its events}}, each operation profiled alone (autograd profiler)."""
    results: dict = {}
    for backend in BACKENDS:
        group = tdist.new_group(backend=backend)
        results[backend] = {}
        for label, call in _ops(rank, group).items():
            with torch.autograd.profiler.profile(record_shapes=True) as profile:
                try:
                    call()
                except RuntimeError as error:  # torch 2.11's gloo has no list all_to_all
                    if backend != "gloo" or "does not support" not in str(error):
                        raise
                    results[backend][label] = None
                    continue
            results[backend][label] = _events(backend, profile)
    return results


def _torch_profiler_all_reduce(rank: int, size: int) -> list:
    """The events torch.profiler (kineto) records for one all_reduce on the plugin's default group."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as profile:
        tdist.all_reduce(torch.ones(3, 2))
    return [(event.name, event.is_async, event.input_shapes) for event in profile.events()
            if event.name.startswith(("pydist:", "gloo:"))]


@pytest.fixture(scope="module")
def profiled() -> list:
    return run_processes(2, _profile_every_op, init="torch", timeout=TIMEOUT)


def test_every_operation_records_what_gloo_records(profiled):
    for rank, results in enumerate(profiled):
        for label, gloo_events in results["gloo"].items():
            if label == "reduce_scatter_tensor" or gloo_events is None:
                continue  # gloo runs it as an all_reduce and names it so (see below), or lacks it
            assert results["pydist"][label] == gloo_events, (rank, label)
            assert gloo_events, (rank, label)  # torch's gloo records one for each


def test_all_reduce_event_is_async_with_the_tensor_shape(profiled):
    for results in profiled:
        assert results["pydist"]["all_reduce"] == [("all_reduce", True, [[3, 2]], 1)]
        assert results["pydist"]["all_reduce complex"] == [("all_reduce", True, [[5, 2]], 1)]
        assert results["pydist"]["recv any source"][0][:2] in {("send", True), ("recvAnySource", True)}


def test_reduce_scatter_tensor_is_named_for_what_pydist_runs(profiled):
    for results in profiled:
        assert results["gloo"]["reduce_scatter_tensor"] == [("all_reduce", True, [[4]], 1)]
        assert results["pydist"]["reduce_scatter_tensor"] == [("reduce_scatter", True, [[4]], 1)]


def test_torch_profiler_shows_the_plugins_all_reduce():
    for events in run_processes(2, _torch_profiler_all_reduce, init="torch", timeout=TIMEOUT):
        assert events == [("pydist:all_reduce", True, [[3, 2]])]


def test_a_blocking_call_done_without_a_work_ends_its_record():
    """The profiler can stop between the plugin's check and the call's (calls.torch_work then returns
    None, as for any blocking call): the record ends there, and None is returned."""
    from pydist.torch._profiling import call_recorded, no_inputs

    class Group:
        profiling_name = "pydist"

    with torch.profiler.profile() as prof:
        assert call_recorded(Group(), "barrier", no_inputs, lambda group: None, ()) is None
    assert [event.name for event in prof.events() if event.name == "pydist:barrier"] == ["pydist:barrier"]
