"""Every public name of torch.distributed 2.13 is in pydist, or listed here with why it is not,
so that a name torch adds is noticed; and the environment questions answer as torch's do."""
from __future__ import annotations

import types

import numpy as np
import pytest

import pydist
from pydist import ReduceOp

torch = pytest.importorskip("torch")
import torch.distributed as tdist  # noqa: E402

IMPORTS = "an import of torch.distributed's own (torch submodules are not counted at all), not an API name"
TORCH_ONLY = "torch's own machinery (C++ classes, DTensor's meshes, RPC): use torch with the pydist plugin"
OPTIONS = "a C++ option struct of torch's ProcessGroup methods: pydist's functions take keyword arguments"
NOT_YET = "not yet in pydist (issue 21)"

#: torch.distributed names pydist does not have, and why.
ABSENT = {
    **dict.fromkeys(["log", "timedelta"], IMPORTS),
    **dict.fromkeys(["DeviceMesh", "init_device_mesh", "ProcessGroupGloo", "Reducer", "Logger", "GradBucket",
                     "BuiltinCommHookType", "record_comm", "GroupName", "RankType", "BackendConfig",
                     "get_default_backend_for_device"], TORCH_ONLY),
    **dict.fromkeys(["AllToAllOptions", "AllreduceCoalescedOptions", "AllreduceOptions", "BarrierOptions",
                     "BroadcastOptions", "GatherOptions", "ReduceOptions", "ReduceScatterOptions", "ScatterOptions"],
                    OPTIONS),
    **dict.fromkeys(["all_gather_coalesced", "breakpoint", "DebugLevel", "get_debug_level", "set_debug_level",
                     "set_debug_level_from_env"], NOT_YET),
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
