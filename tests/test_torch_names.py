"""Every public name of torch.distributed 2.13 is in pydist, or listed here with why it is not,
so that a name torch adds is noticed; and the environment questions answer as torch's do."""
from __future__ import annotations

import inspect
import threading
import time
import types

import numpy as np
import pytest

import pydist
from pydist import ReduceOp

torch = pytest.importorskip("torch")
import torch.distributed as tdist  # noqa: E402

#: both coalesced collectives warn that they will be deprecated (tested once, below)
pytestmark = pytest.mark.filterwarnings("ignore:`pydist.all_.*_coalesced` will be deprecated:FutureWarning")

IMPORTS = "an import of torch.distributed's own (torch submodules are not counted at all), not an API name"
TORCH_ONLY = "torch's own machinery (C++ classes, DTensor's meshes, RPC): use torch with the pydist plugin"
OPTIONS = "a C++ option struct of torch's ProcessGroup methods: pydist's functions take keyword arguments"

#: torch.distributed names pydist does not have, and why.
ABSENT = {
    **dict.fromkeys(["log", "timedelta"], IMPORTS),
    **dict.fromkeys(["DeviceMesh", "init_device_mesh", "ProcessGroupGloo", "ProcessGroupNCCL", "ProcessGroupNCCL2",
                     "ProcessGroupNCCLLazy", "Reducer", "Logger", "GradBucket",
                     "BuiltinCommHookType", "record_comm", "GroupName", "RankType", "BackendConfig",
                     "get_default_backend_for_device"], TORCH_ONLY),
    **dict.fromkeys(["AllToAllOptions", "AllreduceCoalescedOptions", "AllreduceOptions", "BarrierOptions",
                     "BroadcastOptions", "GatherOptions", "ReduceOptions", "ReduceScatterOptions", "ScatterOptions"],
                    OPTIONS),
}


def test_every_torch_name_is_in_pydist_or_listed_with_a_reason():
    torch_names = {name for name in dir(tdist)  # submodules come and go as other code imports them
                   if not name.startswith("_") and not issubclass(type(vars(tdist).get(name)), types.ModuleType)}
    unexplained = sorted(torch_names - set(dir(pydist)) - ABSENT.keys())
    assert not unexplained, f"torch.distributed names missing from pydist and from ABSENT: {unexplained}"
    stale = sorted(ABSENT.keys() & set(dir(pydist)))
    assert not stale, f"listed as absent but pydist has them: {stale}"


def test_environment_questions_answer_as_torchs(monkeypatch):
    for variable in ("TORCHELASTIC_RUN_ID", "LOCAL_RANK"):
        monkeypatch.delenv(variable, raising=False)
    assert pydist.is_torchelastic_launched() is tdist.is_torchelastic_launched() is False
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    assert pydist.is_torchelastic_launched() is tdist.is_torchelastic_launched() is True
    assert pydist.get_node_local_rank(fallback_rank=3) == tdist.get_node_local_rank(fallback_rank=3) == 3
    with pytest.raises(RuntimeError, match="LOCAL_RANK is not in the environment"):
        pydist.get_node_local_rank()
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert pydist.get_node_local_rank() == tdist.get_node_local_rank() == 2
    assert pydist.default_pg_timeout == tdist.default_pg_timeout


@pytest.mark.parametrize("name", ["SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"])
def test_supports_complex_as_torch(name):
    assert pydist.supports_complex(getattr(ReduceOp, name)) == tdist.supports_complex(getattr(tdist.ReduceOp, name))


def test_backend_availability():
    assert pydist.is_backend_available("pydist") and pydist.is_backend_available("PYDIST")
    assert pydist.is_backend_available("mpi") == pydist.is_mpi_available()
    assert not pydist.is_backend_available("nccl") and not pydist.is_nccl_available()
    assert not pydist.is_gloo_available()  # pydist is not gloo: torch's gloo is torch's


def test_get_pg_count_counts_the_groups_made():
    from pydist.testing import run_threads

    def count(rank, size):
        before = pydist.get_pg_count()
        pydist.new_group([0, 1])
        pydist.new_group([0])
        return before, pydist.get_pg_count()
    assert run_threads(2, count) == [(1, 3), (1, 3)]


def _coalesced(rank: int, size: int) -> list:
    a = np.full(3, rank + 1.0, np.float32)
    b = np.arange(4, dtype=np.float32) * (rank + 1)
    pydist.all_reduce_coalesced([a, b])
    c = np.full(2, rank + 1, np.int64)
    work = pydist.all_reduce_coalesced(c, op=ReduceOp.MAX, async_op=True)
    work.wait()
    out = np.zeros(2 * size, np.float32)
    pydist.all_gather_single(out, np.full(2, rank, np.float32))
    scattered = np.zeros(1, np.float32)
    pydist.reduce_scatter_single(scattered, np.arange(size, dtype=np.float32))
    return [a.tolist(), b.tolist(), c.tolist(), out.tolist(), scattered.tolist(), pydist.get_backend_config()]


def test_all_reduce_coalesced_and_the_single_spellings():
    from pydist.testing import run_threads
    results = run_threads(2, _coalesced)
    for rank, (a, b, c, out, scattered, config) in enumerate(results):
        assert a == [3.0] * 3 and b == [0.0, 3.0, 6.0, 9.0] and c == [2, 2]
        assert out == [0.0, 0.0, 1.0, 1.0] and scattered == [2.0 * rank] and config == "cpu:pydist"


def test_all_reduce_coalesced_takes_one_dtype():
    from pydist.testing import run_threads

    def mixed(rank, size):
        with pytest.raises(TypeError, match="tensors\\[1\\]: dtype float64 differs"):
            pydist.all_reduce_coalesced([np.zeros(2, np.float32), np.zeros(2, np.float64)])
        with pytest.raises(ValueError, match="non-empty list"):
            pydist.all_reduce_coalesced([])
        return True
    assert run_threads(2, mixed) == [True, True]


def _coalesced_on_a_device(rank: int, size: int) -> list[str]:
    """What the deprecated coalesced calls say when given device tensors (the test stand-in's,
    which go where CUDA tensors go: core.buffers.device_kind)."""
    from pydist.device import open_device
    device = open_device("standin", 0, rank)
    on_device = device.from_host(np.ones(2, np.float32), "float32", device.current_stream())
    host = np.ones(2, np.float32)
    calls = [lambda: pydist.all_reduce_coalesced([on_device]),
             lambda: pydist.all_reduce_coalesced(on_device),
             lambda: pydist.all_reduce_coalesced([host, on_device]),
             lambda: pydist.all_gather_coalesced([[host] for _ in range(size)], [on_device]),
             lambda: pydist.all_gather_coalesced([[host], [on_device]], [host])]
    messages = []
    for call in calls:
        with pytest.raises(ValueError) as refused:
            call()
        messages.append(str(refused.value))
    return messages


def test_the_coalesced_calls_refuse_device_tensors_saying_what_to_call_instead():
    from pydist.testing import run_threads
    host_only = ("this deprecated call works on host tensors only: call {} once per tensor instead, which takes "
                 "device tensors when pydist's CUDA engine is on (PYDIST_CUDA_ENGINE=1), or move the tensors to "
                 "the host with .cpu()")
    reduce, gather = host_only.format("all_reduce"), host_only.format("all_gather_into_tensor")
    expected = [f"all_reduce_coalesced: tensors[0] is a tensor on standin:0; {reduce}",
                f"all_reduce_coalesced: tensors[0] is a tensor on standin:0; {reduce}",
                f"all_reduce_coalesced: tensors[1] is a tensor on standin:0; {reduce}",
                f"all_gather_coalesced: input_tensor_list[0] is a tensor on standin:0; {gather}",
                f"all_gather_coalesced: output_tensor_lists[1][0] is a tensor on standin:0; {gather}"]
    assert run_threads(2, _coalesced_on_a_device) == [expected, expected]

def _gathered_singly(rank: int, size: int) -> list:
    stacked = np.full((size, 2), -1.0) if rank == 1 else None  # torch's stacked layout, on the destination only
    assert pydist.gather_single(np.full(2, float(rank)), stacked, dst=1) is None
    flat = torch.zeros(2 * size) if rank == 0 else None
    work = pydist.gather_into_tensor(torch.full((2,), rank + 10.0), flat, group_dst=0, async_op=True)
    work.wait()
    if rank == 0:  # refused before anything is sent: the other rank takes no part
        with pytest.raises(ValueError, match="gather_tensor: required on the destination rank"):
            pydist.gather_single(np.zeros(2), None, dst=0)
        with pytest.raises(ValueError, match="gather_tensor: expected 2 x 2 = 4 elements"):
            pydist.gather_single(np.zeros(2), np.zeros(3), dst=0)
    return [None if stacked is None else stacked.tolist(), None if flat is None else flat.tolist()]


@pytest.mark.filterwarnings("ignore:`pydist.gather_into_tensor` is deprecated:FutureWarning")
def test_gather_single_and_its_deprecated_name_gather_into_one_tensor():
    from pydist.testing import run_threads
    assert run_threads(2, _gathered_singly) == [[None, [10.0, 10.0, 11.0, 11.0]], [[[0.0, 0.0], [1.0, 1.0]], None]]


def test_gather_into_tensor_is_deprecated_as_torchs():
    """Checked in the main thread: pytest.warns in thread-ranks races on the warnings filters."""
    modules = (pydist, tdist) if hasattr(tdist, "gather_into_tensor") else (pydist,)  # torch 2.14's
    for module in modules:
        with pytest.warns(FutureWarning, match="gather_into_tensor` is deprecated"), \
                pytest.raises(ValueError, match="Default process group has not been initialized"):
            module.gather_into_tensor(torch.zeros(1), torch.zeros(2))


def test_set_timeout_bounds_the_groups_later_operations():
    from datetime import timedelta

    from pydist.testing import run_threads
    timed_out = threading.Event()

    def wait_for_nothing(rank, size):
        pydist.set_timeout(timedelta(milliseconds=300))  # the group was made with 600 s
        if rank == 1:
            return timed_out.wait(60)  # sends nothing; stays until rank 0 timed out
        with pytest.raises(pydist.DistError, match="Timed out waiting 300ms"):
            pydist.recv(np.zeros(1), src=1)
        timed_out.set()
        with pytest.raises(TypeError, match="timeout: expected datetime.timedelta or seconds, got None"):
            pydist.set_timeout(None)
        return True
    assert run_threads(2, wait_for_nothing, pg_timeout=600) == [True, True]


def test_get_backend_impl_is_the_engine_running_the_group():
    from pydist.testing import run_threads

    def engines(rank, size):
        pair = pydist.new_group([0, 1])
        engine = pydist.get_backend_impl()
        assert pydist.get_backend_impl(device="cpu") is engine and engine.name == "pydist"
        assert pydist.get_backend_impl(pair, torch.device("cpu")) is pydist.get_backend_impl(pair.group_name)
        with pytest.raises(ValueError, match="device: 'cuda'; a pydist group runs host memory only"):
            pydist.get_backend_impl(device="cuda")
        with pytest.raises(ValueError, match="no process group named 'nothing'"):
            pydist.get_backend_impl("nothing")
        return True
    assert run_threads(2, engines) == [True, True]


def test_a_registered_rendezvous_handler_makes_the_world():
    from pydist.rendezvous import _HANDLERS
    store = pydist.HashStore()

    def handler(url, rank=None, world_size=None, timeout=None):
        yield store, 0, 1
    pydist.register_rendezvous_handler("mine", handler)
    try:
        with pytest.raises(RuntimeError, match="Rendezvous handler for mine:// already registered"):
            pydist.register_rendezvous_handler("mine", handler)
        pydist.init_process_group("pydist", init_method="mine://anything")
        try:
            assert pydist.get_world_size() == 1 and pydist.get_rank() == 0
        finally:
            pydist.destroy_process_group()
    finally:
        del _HANDLERS["mine"]


@pytest.mark.parametrize("name", ["all_gather_coalesced", "breakpoint"])
def test_signature_as_torchs(name):
    ours, theirs = ([(p.name, p.default) for p in inspect.signature(getattr(module, name)).parameters.values()]
                    for module in (pydist, tdist))
    assert ours[:len(theirs)] == theirs  # pydist's are the newest torch's: an older torch's are a prefix
    older = tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 13)
    assert len(ours) == len(theirs) or older  # (2.8's breakpoint has no timeout_s)


def test_the_coalesced_collectives_are_deprecated_as_torchs():
    for module in (pydist, tdist):
        with pytest.warns(FutureWarning, match="all_gather_coalesced` will be deprecated"), \
                pytest.raises(ValueError, match="Default process group has not been initialized"):
            module.all_gather_coalesced([[torch.zeros(1)]], [torch.zeros(1)])
        with pytest.warns(FutureWarning, match="all_reduce_coalesced` will be deprecated"), \
                pytest.raises(ValueError, match="Default process group has not been initialized"):
            module.all_reduce_coalesced([torch.zeros(1)])


_SHAPES = [(2, 3), (1,), (4,)]


def _rank_inputs(rank: int) -> list[np.ndarray]:
    return [np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * 10 ** i + rank
            for i, shape in enumerate(_SHAPES)]


def _gather_coalesced(rank: int, size: int) -> list:
    outputs = [[np.full(shape, -1.0) for shape in _SHAPES] for _ in range(size)]
    assert pydist.all_gather_coalesced(outputs, _rank_inputs(rank)) is None
    singles = [[torch.zeros(2, dtype=torch.int32)] for _ in range(size)]
    work = pydist.all_gather_coalesced(singles, [torch.full((2,), rank, dtype=torch.int32)], async_op=True)
    work.wait()
    return [outputs, [row[0].tolist() for row in singles], work.result() == [list(row) for row in singles]]


def test_all_gather_coalesced_gathers_every_ranks_list():
    from pydist.testing import run_threads
    size = 3
    for outputs, singles, result_is_the_outputs in run_threads(size, _gather_coalesced):
        for rank in range(size):
            for got, expected in zip(outputs[rank], _rank_inputs(rank)):
                np.testing.assert_array_equal(got, expected)
        assert singles == [[rank, rank] for rank in range(size)] and result_is_the_outputs


def test_all_gather_coalesced_says_which_argument_is_wrong():
    from pydist.testing import run_threads

    def misuse(rank, size):
        one = [np.zeros(2, np.float32)]
        cases = [
            (TypeError, "input_tensor_list: expected a list of tensors, got ndarray", [[one[0]], [one[0]]], one[0]),
            (ValueError, "input_tensor_list: expected a non-empty list", [[], []], []),
            (TypeError, "output_tensor_lists: expected a list of 2 lists of tensors .one per rank of the group., "
                        "got ndarray", one[0], one),
            (ValueError, "output_tensor_lists: expected 2 lists of tensors .one per rank of the group., got 1",
             [one], one),
            (TypeError, "output_tensor_lists\\[1\\]: expected a list of 1 tensors .one per tensor of "
                        "input_tensor_list., got ndarray", [one, one[0]], one),
            (ValueError, "output_tensor_lists\\[0\\]: expected 1 tensors .one per tensor of input_tensor_list., "
                         "got 2", [one * 2, one], one),
            (ValueError, "output_tensor_lists\\[1\\]\\[0\\]: expected 2 elements .as input_tensor_list\\[0\\]., "
                         "got 3", [one, [np.zeros(3, np.float32)]], one),
            (TypeError, "output_tensor_lists\\[1\\]\\[0\\]: dtype float64 differs from input_tensor_list\\[0\\]'s "
                        "float32", [one, [np.zeros(2)]], one),
            (TypeError, "input_tensor_list\\[1\\]: dtype int64 differs from input_tensor_list\\[0\\]'s float32",
             [one * 2, one * 2], [one[0], np.zeros(2, np.int64)]),
        ]
        for error, message, outputs, inputs in cases:
            with pytest.raises(error, match=message):
                pydist.all_gather_coalesced(outputs, inputs)
        return True
    assert run_threads(2, misuse) == [True, True]


def test_all_gather_coalesced_catches_ranks_passing_other_sizes():
    from pydist.testing import run_threads
    from pydist.testing.threads import RankFailed

    def uneven(rank, size):
        sizes = [2, 2] if rank == 0 else [2, 3]
        pydist.all_gather_coalesced([[np.zeros(n) for n in sizes] for _ in range(size)],
                                    [np.zeros(n) for n in sizes])
    with pytest.raises(RankFailed) as failed:
        run_threads(2, uneven, pg_timeout=5)
    assert isinstance(failed.value.__cause__, pydist.DesyncError)


class _FakePdb:
    """Stands in for the debugger: notes what it was told, and holds its rank for ``seconds``."""

    def __init__(self, events: list, seconds: float = 0.0):
        self.events, self.seconds = events, seconds

    def message(self, text: str) -> None:
        self.events.append(("message", pydist.get_rank(), text))

    def set_trace(self) -> None:
        time.sleep(self.seconds)
        self.events.append(("continued", pydist.get_rank()))


@pytest.mark.slow
def test_breakpoint_stops_one_rank_and_the_others_wait_for_it(monkeypatch):
    from pydist.api import breakpoint as _breakpoint
    from pydist.testing import run_threads
    events: list = []
    monkeypatch.setattr(_breakpoint, "_make_distributed_pdb", lambda: _FakePdb(events, seconds=0.6))

    def debug(rank, size):
        pydist.breakpoint(rank=1, timeout_s=30)  # longer than the group's timeout: the session may last
        events.append(("past", rank))
    run_threads(3, debug, pg_timeout=0.3)
    assert events[0] == ("message", 1, "\n!!! ATTENTION !!!\n\nType 'up' to get to the frame that called "
                                        "dist.breakpoint(rank=1)\n")
    assert events[1] == ("continued", 1) and sorted(events[2:]) == [("past", 0), ("past", 1), ("past", 2)]


def test_breakpoint_skips_the_first_calls_of_each_line(monkeypatch, caplog):
    from pydist.api import breakpoint as _breakpoint
    from pydist.testing import run_threads
    events: list = []
    monkeypatch.setattr(_breakpoint, "_make_distributed_pdb", lambda: _FakePdb(events))

    def debug(rank, size):
        for _ in range(4):
            pydist.breakpoint(rank=0, skip=2)
        pydist.breakpoint(rank=0, skip=1)  # another line: counted on its own
    with caplog.at_level("WARNING", logger="pydist"):
        run_threads(2, debug)
    assert [e for e in events if e[0] == "continued"] == [("continued", 0)] * 2
    skipped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Skip")]
    assert sorted(skipped) == sorted(["Skip the breakpoint, counter=1", "Skip the breakpoint, counter=2"] * 2
                                     + ["Skip the breakpoint, counter=1"] * 2)


def test_breakpoint_runs_pdb_on_the_commands_of_stdin(monkeypatch, tmp_path, capsys):
    from pydist.api import breakpoint as _breakpoint
    from pydist.testing import run_threads
    commands = tmp_path / "stdin"
    commands.write_text("p rank\nup\np marker\nc\n")
    monkeypatch.setattr(_breakpoint, "_STDIN", str(commands))

    def debug(rank, size):
        marker = "the caller's frame"
        pydist.breakpoint()
        return marker
    assert run_threads(1, debug) == ["the caller's frame"]
    shown = capsys.readouterr().out
    assert "!!! ATTENTION !!!" in shown and "(Pdb) 0\n" in shown and '"the caller\'s frame"' in shown


def test_breakpoint_needs_a_process_group():
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        pydist.breakpoint()
