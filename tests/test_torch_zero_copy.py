"""Zero copy leaves the user's tensor as it was: its storage stays resizable after any
collective (torch's ``.numpy()`` would mark it unresizable, which breaks FSDP v1's
``_free_storage``, the batched PowerSGD hook and DDP's bucket views). The programs run at
2 ranks on a gloo group and on a pydist group, compared."""
import gc

import numpy as np
import pytest

from pydist.core.buffers import as_buffer

torch = pytest.importorskip("torch")
import torch.distributed as tdist  # noqa: E402
from test_torch_futures import PARAMETERS, _model, _on_both, _train  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.complex64])
def test_a_wrapped_tensor_can_still_be_resized(dtype):
    tensor = torch.ones(4, dtype=dtype)
    buffer = as_buffer(tensor, "tensor")
    buffer.write_back()
    tensor.resize_(8)
    assert tensor.shape == (8,)


def test_the_view_shares_the_tensors_memory_and_keeps_it_alive():
    tensor = torch.arange(6, dtype=torch.float64).view(2, 3)
    array = as_buffer(tensor, "tensor").array
    array[1] = 40.0
    assert tensor[0, 1].item() == 40.0 and not as_buffer(tensor, "tensor").staged
    expected = tensor.clone()
    del tensor
    gc.collect()
    np.testing.assert_array_equal(array, expected.view(-1).numpy())


def test_views_with_offsets_strides_requires_grad_and_no_elements():
    base = torch.arange(12, dtype=torch.float32)
    assert as_buffer(base[3:7], "tensor").array.tolist() == [3.0, 4.0, 5.0, 6.0]
    strided = as_buffer(base.view(3, 4).t(), "tensor")
    assert strided.staged and strided.array.tolist() == base.view(3, 4).t().reshape(-1).tolist()
    param = torch.nn.Parameter(torch.ones(3))
    as_buffer(param, "tensor").array[:] = 2.0
    assert param.detach().tolist() == [2.0, 2.0, 2.0]
    assert as_buffer(torch.zeros(0, 3), "tensor").array.shape == (0,)
    assert as_buffer(torch.tensor(5), "tensor").array.tolist() == [5]


def test_lazy_conjugate_and_negative_views_are_read_resolved_and_refused_as_targets():
    """Their memory does not hold their values: a read resolves a copy, a write (whose result
    would land in that copy and be lost) is refused; torch refuses conjugated views too."""
    values = torch.tensor([1 + 2j, 3 - 1j])
    assert as_buffer(values.conj(), "tensor", writable=False).array.tolist() == [1 - 2j, 3 + 1j]
    negated = torch._neg_view(torch.tensor([1.0, 2.0]))
    assert as_buffer(negated, "tensor", writable=False).array.tolist() == [-1.0, -2.0]
    with pytest.raises(ValueError, match="tensor: this tensor receives data but is a lazily conjugated view"):
        as_buffer(values.conj(), "tensor")
    with pytest.raises(ValueError, match="output: .* lazily negated view.*resolve_neg"):
        as_buffer(negated, "output")


def test_unsupported_tensor_dtype_names_the_argument():
    with pytest.raises(TypeError, match="tensor_list\\[0\\]: unsupported tensor dtype"):
        as_buffer(torch.ones(2, dtype=torch.float8_e4m3fn), "tensor_list[0]")  # numpy has no float8


def _grown(*tensors):
    """Resize each tensor to twice its elements (what torch's FSDP/PowerSGD do); their first values."""
    values = []
    for tensor in tensors:
        values.append(tensor.reshape(-1).tolist())
        tensor.resize_(2 * tensor.numel() + 1)
    return values


def _every_collective_then_resize(rank, size, group):
    out = {}
    t = torch.full((3,), rank + 1.0)
    tdist.all_reduce(t, group=group)
    out["all_reduce"] = _grown(t)
    t = torch.full((3,), rank + 1.0)
    tdist.all_reduce(t, group=group, async_op=True).wait()
    out["all_reduce_async"] = _grown(t)
    t = torch.full((2,), float(rank))
    tdist.broadcast(t, src=1, group=group)
    out["broadcast"] = _grown(t)
    t = torch.full((2,), rank + 1.0)
    tdist.reduce(t, dst=0, group=group)
    out["reduce"] = _grown(t)[0] if rank == 0 else None
    slots, mine = [torch.zeros(2) for _ in range(size)], torch.full((2,), float(rank))
    tdist.all_gather(slots, mine, group=group)
    out["all_gather"] = _grown(*slots, mine)
    flat, mine = torch.zeros(2 * size), torch.full((2,), float(rank))
    tdist.all_gather_into_tensor(flat, mine, group=group)
    out["all_gather_into_tensor"] = _grown(flat, mine)
    piece, whole = torch.zeros(2), torch.arange(2.0 * size) + rank
    tdist.reduce_scatter_tensor(piece, whole, group=group)
    out["reduce_scatter_tensor"] = _grown(piece, whole)
    received, sent = torch.zeros(size), torch.arange(size, dtype=torch.float32) + 10 * rank
    tdist.all_to_all_single(received, sent, group=group)
    out["all_to_all_single"] = _grown(received, sent)
    mine, slots = torch.full((1,), float(rank)), [torch.zeros(1) for _ in range(size)]
    tdist.gather(mine, slots if rank == 0 else None, dst=0, group=group)
    out["gather"] = _grown(mine, *(slots if rank == 0 else []))
    mine, pieces = torch.zeros(1), [torch.tensor([3.0 * j]) for j in range(size)]
    tdist.scatter(mine, pieces if rank == 0 else None, src=0, group=group)
    out["scatter"] = _grown(mine, *(pieces if rank == 0 else []))
    t = torch.full((2,), float(rank))
    if rank == 0:
        tdist.send(t, dst=1, group=group)
    else:
        tdist.recv(t, src=0, group=group)
    out["send_recv"] = _grown(t)
    t = torch.full((2,), float(rank), dtype=torch.bfloat16)
    tdist.all_reduce(t, group=group)
    out["bf16_all_reduce"] = _grown(t)
    return out


@pytest.mark.slow
def test_every_collective_leaves_tensors_resizable():
    for results in _on_both(_every_collective_then_resize):
        assert results["pydist"] == results["gloo"]
    assert results["pydist"]["all_reduce"] == [[3.0, 3.0, 3.0]]


def _ddp_bucket_views(rank, size, group, steps):
    ddp = torch.nn.parallel.DistributedDataParallel(_model(), process_group=group, gradient_as_bucket_view=True)
    _train(ddp, rank, size, steps)
    return [p.detach().numpy().copy() for p in ddp.module.parameters()]


@pytest.mark.slow
def test_ddp_gradient_as_bucket_view_matches_gloo():
    runs = _on_both(_ddp_bucket_views, 4)
    assert len(runs) == 2  # both ranks' parameters
    for results in runs:
        assert len(results["pydist"]) == len(results["gloo"]) == PARAMETERS
        for got, want in zip(results["pydist"], results["gloo"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _fsdp_v1(rank, size, group, steps):
    from torch.distributed.fsdp import FullyShardedDataParallel
    fsdp = FullyShardedDataParallel(_model(), process_group=group, device_id=torch.device("cpu"))
    _train(fsdp, rank, size, steps)
    with FullyShardedDataParallel.summon_full_params(fsdp):  # clone: .numpy() would pin FSDP's storage
        return [p.detach().clone().numpy() for p in fsdp.parameters()]


@pytest.mark.slow
def test_fsdp_v1_on_cpu_trains_like_gloo():
    runs = _on_both(_fsdp_v1, 3)
    assert len(runs) == 2  # both ranks' parameters
    for results in runs:
        assert len(results["pydist"]) == len(results["gloo"]) == PARAMETERS  # unflattened by summon_full_params
        for got, want in zip(results["pydist"], results["gloo"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    initial = torch.cat([p.detach().reshape(-1) for p in _model().parameters()]).numpy()
    assert not np.allclose(np.concatenate([p.reshape(-1) for p in results["pydist"]]), initial)  # it trained
