"""Tensors on another device beside pydist: "cpu:pydist,cuda:gloo" makes the CUDA backend
inside pydist's group (torch alone would drop it), CPU tensors stay on pydist, a call's tensors
are routed by device, and what cannot work is refused at init or at the call. On torch's CPU
build: the group's structure, the routing (with "meta" tensors as the other device) and the
errors; tests/test_torch_gpu.py runs CUDA tensors where a GPU is."""
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as tdist  # noqa: E402
from torch._C._distributed_c10d import Backend  # noqa: E402

import pydist.torch  # noqa: E402
from pydist.testing import run_processes  # noqa: E402
from pydist.torch.backend import ProcessGroupPydist  # noqa: E402
from pydist.torch.devices import PAIR_BY_PAIR, device_of, other_devices  # noqa: E402


def _structure(rank, size):
    world = tdist.group.WORLD
    cuda = world._get_backend(torch.device("cuda"))
    t = torch.ones(3) * (rank + 1)
    tdist.all_reduce(t)  # CPU: pydist
    direct = torch.ones(2) * (rank + 1)
    cuda.allreduce([direct]).wait()  # the gloo group works, on the same members
    pair = tdist.new_group([0, 1])
    return {"type": type(world).__name__, "cuda": type(cuda).__name__, "rank": cuda.rank(), "size": cuda.size(),
            "cpu": t.tolist(), "direct": direct.tolist(), "subgroup": sorted(pair.device_backends),
            "backend": tdist.get_backend()}


@pytest.mark.slow
@pytest.mark.parametrize("init", ["torch:cpu:pydist,cuda:gloo", "torch:cuda:gloo,cpu:pydist"])
def test_a_gloo_backend_string_for_cuda_makes_it_inside_pydists_group(init):
    """Before: torch replaced the group by pydist's and _get_backend(cuda) raised."""
    results = run_processes(2, _structure, init=init, timeout=120)
    for rank, out in enumerate(results):
        assert out["type"] == "ProcessGroupPydist" and out["cuda"] == "ProcessGroupGloo"
        assert (out["rank"], out["size"]) == (rank, 2)
        assert out["cpu"] == [3.0] * 3 and out["direct"] == [3.0] * 2
        assert out["subgroup"] == ["cuda"]


def _made_backends(rank, size):
    return sorted(tdist.group.WORLD.device_backends)


@pytest.mark.slow
def test_pydist_cuda_setting_makes_the_cuda_backend_for_plain_pydist():
    assert run_processes(2, _made_backends, init="torch", env={"PYDIST_CUDA": "gloo"}, timeout=120) == [["cuda"]] * 2
    assert run_processes(2, _made_backends, init="torch", timeout=120) == [[]] * 2


def test_the_backend_string_wins_over_the_setting_and_other_backends_are_refused():
    assert other_devices({"cpu": "pydist", "cuda": "gloo"}, "nccl") == {"cuda": "gloo"}
    assert other_devices({"cpu": "pydist"}, "gloo") == {"cuda": "gloo"}
    assert other_devices({"cpu": "pydist", "cuda": "pydist"}, "gloo") == {}
    assert other_devices(None, "pydist") == {}
    with pytest.raises(ValueError, match='cuda:ucc.*"cpu:pydist,cuda:gloo"'):
        other_devices({"cpu": "pydist", "cuda": "ucc"}, None)
    if not tdist.is_nccl_available():
        with pytest.raises(RuntimeError, match="has no NCCL.*cpu:pydist,cuda:gloo"):
            other_devices({"cpu": "pydist", "cuda": "nccl"}, None)
    with pytest.raises(ValueError, match="Options\\(cuda\\)"):
        pydist.torch.Options(cuda="ucc")


def test_a_call_mixing_devices_is_refused_naming_them():
    with pytest.raises(ValueError, match="allgather: tensors on cpu, meta in one call"):
        device_of("allgather", [torch.zeros(1), torch.empty(1, device="meta")])
    assert device_of("barrier", []) == "cpu"


class _Recorder:
    """A device backend that records what it was asked."""

    def __init__(self):
        self.calls = []

    def name(self):
        return "recorder"

    def __getattr__(self, operation):
        return lambda *args: self.calls.append((operation, len(args))) or "work"


def _routing(rank, size):
    group = tdist.group.WORLD
    recorder = _Recorder()
    group.device_backends["meta"] = recorder
    meta = torch.empty(2, device="meta")
    assert group.allreduce([meta], tdist.AllreduceOptions()) == "work"
    assert group.send([meta], (rank + 1) % size, 0) == "work"
    assert group._allgather_base(torch.empty(4, device="meta"), meta, None) == "work"
    with pytest.raises(ValueError, match="tensors on cpu, meta"):
        group.allgather([[torch.zeros(2), torch.zeros(2)]], [meta], None)
    t = torch.ones(1)
    tdist.all_reduce(t)  # CPU tensors still run on pydist
    del group.device_backends["meta"]
    # without a backend for them the group looks at the devices once pydist refused the call
    with pytest.raises(ValueError, match="a tensor on meta; this group runs CPU tensors on pydist"):
        tdist.broadcast(meta, src=0)
    with pytest.raises(ValueError, match="a tensor on meta; this group runs CPU tensors on pydist"):
        group.send([meta], (rank + 1) % size, 0)
    with pytest.raises(ValueError, match="tensors on cpu, meta"):
        group.allgather([[torch.zeros(2), torch.zeros(2)]], [meta], None)
    # a coalesced call makes one pydist call per pair: refused before the first pair ran
    untouched = torch.zeros(2 * size)
    with pytest.raises(ValueError, match="tensors on cpu, meta"):
        group.allgather_into_tensor_coalesced([untouched, torch.empty(2 * size, device="meta")],
                                              [torch.ones(2), meta], None)
    with pytest.raises(ValueError, match="tensors on cpu, meta"):
        group.allreduce_coalesced([torch.ones(2), meta], None)
    tdist.barrier()  # what was issued before would have run by now
    assert untouched.tolist() == [0.0] * (2 * size)
    return recorder.calls, t.item()


@pytest.mark.slow
def test_each_call_goes_to_the_backend_of_its_tensors_device():
    for calls, cpu in run_processes(2, _routing, init="torch", timeout=120):
        assert calls == [("allreduce", 2), ("send", 3), ("_allgather_base", 2)]  # the None option left out
        assert cpu == 2.0


def test_every_routed_operation_exists_on_torchs_backend():
    """A typo or a renamed torch method would fail only on a GPU: check the names here."""
    routed = [name for name, member in vars(ProcessGroupPydist).items()
              if callable(member) and getattr(member, "__wrapped__", None) is not None and name == member.__name__]
    assert len(routed) >= 17
    for name in routed:  # gather_single: torch 2.14's, which an older torch never calls
        assert hasattr(Backend, PAIR_BY_PAIR.get(name, name)) or not hasattr(tdist.ProcessGroup, name), name


def _cuda_engine(rank, size):
    """Whether the group runs CUDA tensors on pydist's own engine: torch's backend of the
    group for cuda is the group itself, no torch backend was made beside it."""
    world = tdist.group.WORLD
    try:
        itself = world._get_backend(torch.device("cuda")) is world
    except RuntimeError:
        itself = False
    return itself, sorted(world.device_backends)


@pytest.mark.slow
def test_cuda_pydist_or_the_setting_runs_cuda_tensors_on_pydists_engine():
    """Before: PYDIST_CUDA_ENGINE=1 only warned that the engine was not there, and
    "cpu:pydist,cuda:pydist" left CUDA tensors with no backend."""
    assert run_processes(1, _cuda_engine, init="torch:cpu:pydist,cuda:pydist", timeout=120) == [(True, [])]
    assert run_processes(1, _cuda_engine, init="torch", env={"PYDIST_CUDA_ENGINE": "1"}, timeout=120) == [(True, [])]
    assert run_processes(1, _cuda_engine, init="torch", timeout=120) == [(False, [])]
