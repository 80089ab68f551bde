"""Sparse COO all_reduce and DDP over sparse gradients (nn.Embedding(sparse=True)), against gloo.

Each program runs the same calls on a gloo group and on pydist (torch's plugin, and pydist's
own API / DDP) in real processes at 2 and 3 ranks; the results must be gloo's exactly
(indices, values, coalesced state, the same tensor object). Thread-rank tests cover misuse.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as tdist  # noqa: E402

import pydist  # noqa: E402
from pydist.testing import run_processes, run_threads  # noqa: E402
from pydist.testing.processes import free_port  # noqa: E402

# A hang guard, not a timing bound: each process test starts 2-3 torch processes that set up
# gloo and pydist; on a loaded 2-core machine one took over the default 120 s.
pytestmark = pytest.mark.timeout(300)


def _gloo_world(rank: int, size: int, port: int) -> None:
    """torch.distributed's default group on gloo, beside pydist's own world (init="env")."""
    tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)


def _sparse(indices, values, shape) -> torch.Tensor:
    return torch.sparse_coo_tensor(torch.tensor(indices), values, shape)


def _cases(rank: int, size: int) -> list[tuple[str, torch.Tensor]]:
    """(name, this rank's input) for one sparse all_reduce each; inputs differ per rank."""
    generator = torch.Generator().manual_seed(rank)

    def randn(*shape, dtype=torch.float32):
        return torch.randn(*shape, generator=generator).to(dtype)

    return [
        ("uncoalesced, duplicates", _sparse([[0, 3, 0, rank]], randn(4), (6,))),
        ("2 sparse dims + 1 dense dim, float64",
         _sparse([[rank, 0, 1], [1, rank, 1]], randn(3, 2, dtype=torch.float64), (size, size, 2))),
        ("int64", _sparse([[rank, size]], torch.tensor([rank + 1, 7]), (size + 1,))),
        ("bfloat16, 2 dense dims", _sparse([[rank % 2, 2]], randn(2, 2, 3, dtype=torch.bfloat16), (3, 2, 3))),
        ("empty on rank 0", _sparse([[1] * rank], randn(rank), (4,))),
        ("empty everywhere", _sparse([[]], randn(0), (4,))),
        ("coalesced input", _sparse([[0, 1 + rank]], randn(2), (size + 2,)).coalesce()),
        ("0-dimensional", torch.sparse_coo_tensor(torch.zeros(0, 1, dtype=torch.long), torch.tensor([rank + 0.5]),
                                                  ())),
    ]


def _snapshot(tensor: torch.Tensor) -> dict:
    values = tensor._values()
    return {"indices": tensor._indices().tolist(), "coalesced": tensor.is_coalesced(), "dtype": str(tensor.dtype),
            "values": (values.float() if values.dtype == torch.bfloat16 else values).tolist(),
            "shape": list(tensor.shape)}


def _reduce_all(rank: int, size: int, all_reduce) -> dict:
    """Every case through ``all_reduce(tensor) -> the value its Work delivered``."""
    results = {}
    for name, tensor in _cases(rank, size):
        value = all_reduce(tensor)
        assert value is tensor, f"{name}: the result is not the input tensor"
        results[name] = _snapshot(tensor)
    return results


def _torch_all_reduce(group):
    def run(tensor):
        work = tdist.all_reduce(tensor, group=group, async_op=True)
        [value] = work.get_future().wait()
        return value
    return run


def _on_torch(rank: int, size: int) -> dict:
    """The cases on gloo (a new_group) and on the "pydist" default group, plus misuse on pydist."""
    gloo = tdist.new_group(backend="gloo")
    out = {"gloo": _reduce_all(rank, size, _torch_all_reduce(gloo)),
           "pydist": _reduce_all(rank, size, _torch_all_reduce(None))}
    tensor = _sparse([[0]], torch.ones(1), (2,))
    with pytest.raises(ValueError, match="only works with ReduceOp.SUM"):
        tdist.all_reduce(tensor, op=tdist.ReduceOp.MAX)
    with pytest.raises(ValueError, match=r"same shape.*rank 0 has shape \(2,\).*rank 1 has shape \(3,\)"):
        tdist.all_reduce(_sparse([[0]], torch.ones(1), (2 + min(rank, 1),)))
    tdist.all_reduce(tensor)  # the group is still usable
    out["after_error"] = tensor.to_dense().tolist()
    return out


def _on_pydist(rank: int, size: int, port: int) -> dict:
    """The cases through pydist's own all_reduce, and on a gloo world beside it."""
    def run(tensor):
        work = pydist.all_reduce(tensor, async_op=True)
        [value] = work.result()
        return value

    _gloo_world(rank, size, port)
    try:
        return {"gloo": _reduce_all(rank, size, _torch_all_reduce(None)), "pydist": _reduce_all(rank, size, run)}
    finally:
        tdist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 3])
def test_torch_sparse_all_reduce_on_the_plugin_equals_gloo_exactly(size):
    results = run_processes(size, _on_torch, init="torch", timeout=180)
    for out in results:
        assert out["pydist"] == out["gloo"] == results[0]["gloo"]
        assert out["after_error"] == [float(size), 0.0]
    first = results[0]["gloo"]["uncoalesced, duplicates"]
    assert first["coalesced"] and first["indices"] == [sorted({0, 3, *range(size)})]


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 3])
def test_pydist_all_reduce_of_sparse_equals_gloo_exactly(size):
    for out in run_processes(size, _on_pydist, free_port(), init="env", timeout=180):
        assert out["pydist"] == out["gloo"]


# -- misuse (thread ranks) ---------------------------------------------------------------------

def test_sparse_all_reduce_misuse_is_refused_at_the_call():
    def body(rank, size):
        tensor = _sparse([[0]], torch.ones(1), (2,))
        with pytest.raises(ValueError, match="op: all_reduce of sparse tensors only works with ReduceOp.SUM"):
            pydist.all_reduce(tensor, op=pydist.ReduceOp.AVG)
        with pytest.raises(ValueError, match="tensor: pydist works on CPU tensors"):
            pydist.all_reduce(tensor.to("meta"))
        with pytest.raises(ValueError, match="only dense"):  # other sparse layouts stay refused
            pydist.all_reduce(torch.eye(2).to_sparse_csr())
        pydist.all_reduce(tensor)
        return tensor.to_dense().tolist()

    assert run_threads(2, body) == [[2.0, 0.0]] * 2


def test_ranks_disagreeing_on_dtype_all_fail_and_the_group_goes_on():
    def body(rank, size):
        dtype = torch.float64 if rank == 2 else torch.float32
        with pytest.raises(ValueError, match="rank 2 has shape .* dtype torch.float64"):
            pydist.all_reduce(_sparse([[rank]], torch.ones(1, dtype=dtype), (3,)), async_op=True).wait()
        dense = np.ones(2)
        pydist.all_reduce(dense)
        return dense.tolist()

    assert run_threads(3, body) == [[3.0, 3.0]] * 3


# -- DDP over sparse gradients: torch's DDP on the plugin, pydist's own DDP, both against gloo --

STEPS = 4


def _embedding_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.EmbeddingBag(30, 4, mode="sum", sparse=True), torch.nn.Linear(4, 3))


def _train(model: torch.nn.Module, rank: int) -> dict:
    """STEPS of SGD on this rank's batches (different rows per rank, some rows shared); the
    parameters as numpy arrays (torch tensors would cross processes through shared memory)."""
    generator = torch.Generator().manual_seed(10 + rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(STEPS):
        rows = torch.randint(0, 30, (6, 3), generator=generator)
        target = torch.randint(0, 3, (6,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(rows), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    state = getattr(model, "module", model).state_dict()  # without DDP's "module." prefix
    return {name: value.detach().numpy().copy() for name, value in state.items()}


def _torch_ddp(rank: int, size: int) -> dict:
    """torch's DDP over gloo (a new_group) and over the "pydist" default group."""
    ddp = torch.nn.parallel.DistributedDataParallel
    gloo = tdist.new_group(backend="gloo")
    return {"gloo": _train(ddp(_embedding_model(), process_group=gloo), rank),
            "pydist": _train(ddp(_embedding_model()), rank)}


def _pydist_ddp(rank: int, size: int, port: int) -> dict:
    """pydist's own DDP, and torch's DDP on a gloo world beside it."""
    from pydist.torch.ddp import DistributedDataParallel
    _gloo_world(rank, size, port)
    try:
        return {"gloo": _train(torch.nn.parallel.DistributedDataParallel(_embedding_model()), rank),
                "pydist": _train(DistributedDataParallel(_embedding_model()), rank)}
    finally:
        tdist.destroy_process_group()


def _assert_same(got: dict, want: dict, atol: float) -> None:
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], atol=atol, rtol=0, err_msg=name)


def _assert_trained_as_over_gloo(results: list[dict]) -> None:
    gloo = results[0]["gloo"]
    single = _train(_embedding_model(), 0)
    assert not np.array_equal(gloo["0.weight"], single["0.weight"])  # the ranks' gradients were combined
    for out in results:
        _assert_same(out["gloo"], gloo, atol=0)  # every gloo rank ends alike
        # the sparse gradient is gloo's bit for bit; dense ones may round differently (reduction order)
        _assert_same(out["pydist"], gloo, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 3])
def test_torch_ddp_with_sparse_embedding_on_the_plugin_trains_as_over_gloo(size):
    _assert_trained_as_over_gloo(run_processes(size, _torch_ddp, init="torch", timeout=180))


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 3])
def test_pydist_ddp_with_sparse_embedding_trains_as_over_gloo(size):
    _assert_trained_as_over_gloo(run_processes(size, _pydist_ddp, free_port(), init="env", timeout=180))
