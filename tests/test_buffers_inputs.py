"""Inputs: numpy arrays, torch CPU tensors (zero copy, bfloat16), buffer-protocol objects."""
import array

import numpy as np
import pytest

import pydist as dist
from pydist.core.buffers import as_buffer, bf16_bits_to_float32, float32_to_bf16_bits
from pydist.testing import run_threads

torch = pytest.importorskip("torch")


def test_numpy_contiguous_is_zero_copy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf = as_buffer(a, "t")
    assert not buf.staged and np.shares_memory(buf.array, a) and buf.array.shape == (12,)


def test_numpy_strided_is_staged_and_written_back():
    a = np.zeros((4, 4), np.int32)
    view = a[:, 1]
    buf = as_buffer(view, "t")
    assert buf.staged
    buf.array[:] = [1, 2, 3, 4]
    buf.write_back()
    assert a[:, 1].tolist() == [1, 2, 3, 4] and a[:, 0].tolist() == [0, 0, 0, 0]


def test_torch_tensor_is_zero_copy_even_with_grad():
    t = torch.arange(6, dtype=torch.float64, requires_grad=True)
    buf = as_buffer(t, "t")
    assert not buf.staged and buf.array.ctypes.data == t.data_ptr()


def test_bfloat16_round_trip_is_exact_and_rounds_to_nearest_even():
    t = torch.tensor([1.0, -2.5, 3.140625, float("inf"), float("nan"), 1e-40], dtype=torch.bfloat16)
    widened = bf16_bits_to_float32(t.view(torch.int16).numpy())
    assert np.array_equal(widened[:4], t.float().numpy()[:4]) and np.isnan(widened[4])
    values = np.array([1.00390625, 1.01171875, 3.0e38, -7.5], np.float32)  # ties and plain values
    ours = float32_to_bf16_bits(values)
    assert np.array_equal(ours, torch.from_numpy(values).bfloat16().view(torch.int16).numpy())


def test_buffer_protocol_objects():
    arr = array.array("d", [1.0, 2.0])
    buf = as_buffer(arr, "t")
    assert buf.array.dtype == np.float64 and np.shares_memory(buf.array, np.frombuffer(arr))
    assert as_buffer(bytearray(b"ab"), "t").array.dtype == np.uint8
    with pytest.raises(ValueError, match="read-only"):
        as_buffer(b"abc", "tensor")
    assert as_buffer(b"abc", "tensor", writable=False).array.tolist() == [97, 98, 99]


@pytest.mark.parametrize("bad, error, words", [
    ([1, 2], TypeError, "tensor: expected a numpy array"),
    ("text", TypeError, "tensor: expected"),
    (np.array(["a"]), TypeError, "unsupported dtype"),
    (np.array([object()]), TypeError, "unsupported dtype"),
])
def test_unsupported_inputs_name_the_argument(bad, error, words):
    with pytest.raises(error, match=words):
        as_buffer(bad, "tensor")


def test_non_cpu_tensor_is_rejected():
    with pytest.raises(ValueError, match="CPU tensors"):
        as_buffer(torch.empty(2, device="meta"), "tensor")


def _torch_ops(rank, size):
    out = {}
    t = torch.tensor([1.5, -2.0, 3.0], dtype=torch.bfloat16) * (rank + 1)
    dist.all_reduce(t)
    out["bf16"] = t.float().tolist()
    g = torch.zeros(4, 3)
    col = g[:, 1]  # non-contiguous view: staged and written back in place
    col += rank + 1
    dist.all_reduce(col)
    out["strided"] = g.tolist()
    x = torch.arange(4, dtype=torch.int64) + rank
    work = dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True)
    out["result_is_tensor"] = work.result()[0] is x
    out["max"] = x.tolist()
    h = torch.full((2,), float(rank), dtype=torch.float16)
    dist.broadcast(h, src=size - 1)
    out["f16"] = h.tolist()
    return out


@pytest.mark.parametrize("transport", ["loopback", "tcp"])
def test_torch_tensors_through_collectives(transport):
    size = 3
    results = run_threads(size, _torch_ops, transport=transport)
    total = sum(range(1, size + 1))
    for _rank, out in enumerate(results):
        assert out["bf16"] == [1.5 * total, -2.0 * total, 3.0 * total]
        assert out["strided"] == [[0.0, float(total), 0.0]] * 4
        assert out["result_is_tensor"] and out["max"] == [size - 1 + i for i in range(4)]
        assert out["f16"] == [float(size - 1)] * 2


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int32", "int64", "float16", "float32", "float64",
                                   "complex64", "complex128"])
def test_as_bytes_is_the_arrays_own_memory(dtype):
    """The transports read and write a buffer through as_bytes: a view of the same bytes
    (no copy), writable for a writable array, read-only for a read-only one."""
    from pydist.algorithms.comm import as_bytes
    values = np.arange(6).astype(dtype).reshape(2, 3)
    view = as_bytes(values)
    assert view.nbytes == values.nbytes and bytes(view) == values.tobytes()
    view[:values.itemsize] = bytes(values.itemsize)
    assert values.reshape(-1)[0] == 0 and not view.readonly
    values.flags.writeable = False
    assert as_bytes(values).readonly


def _general(obj):
    """as_buffer's Buffer for ``obj`` as its general path makes it (the plain-tensor path off)."""
    from pydist.core import buffers
    saved = set(buffers._TENSOR_CLASSES)
    buffers._TENSOR_CLASSES.clear()
    try:
        return as_buffer(obj, "t")
    finally:
        buffers._TENSOR_CLASSES.update(saved)


@pytest.mark.parametrize("make", [
    lambda: torch.arange(6, dtype=torch.float32).reshape(2, 3),
    lambda: torch.nn.Parameter(torch.ones(4, dtype=torch.float64)),
    lambda: torch.zeros(0, dtype=torch.int64),
    lambda: torch.tensor([True, False]),
    lambda: torch.ones(4, dtype=torch.complex64) * 1j,
    lambda: torch.arange(8, dtype=torch.int32).reshape(2, 4)[:, 1],  # strided: staged
    lambda: (torch.ones(4, dtype=torch.complex64) * 1j).conj(),  # a lazy view: resolved, refused for writing
    lambda: torch.ones(3, dtype=torch.bfloat16),
], ids=["2d", "parameter", "empty", "bool", "complex", "strided", "conj", "bf16"])
def test_a_tensor_met_again_gets_the_buffer_of_the_general_path(make):
    """The second tensor of a class and dtype takes the plain-tensor path where it applies:
    the same view of the same memory, name, shape and staging as the general path's."""
    as_buffer(make().detach(), "t", writable=False)  # the class and dtype are met once
    tensor = make()
    try:
        expected = _general(tensor)
    except ValueError as error:
        with pytest.raises(ValueError, match=str(error)[:40]):
            as_buffer(tensor, "t")
        return
    got = as_buffer(tensor, "t")
    assert (got.dtype_name, got.shape, got.staged, got.array.dtype, got.array.shape, got.obj) == (
        expected.dtype_name, expected.shape, expected.staged, expected.array.dtype, expected.array.shape, tensor)
    assert np.array_equal(got.array, expected.array)
    if not got.staged and got.array.size:
        assert got.array.ctypes.data == tensor.data_ptr()


def test_a_small_tensors_view_is_kept_per_address_size_and_dtype():
    """A call that repeats on a small tensor reuses its view (issue 49); a tensor at the same
    address with another size or dtype gets a view of its own."""
    tensor = torch.arange(8, dtype=torch.float32)
    first = as_buffer(tensor, "t").array
    assert as_buffer(tensor, "t").array is first
    head = as_buffer(tensor[:4], "t").array
    ints = as_buffer(tensor.view(torch.int32), "t").array
    assert (head.shape, head.dtype, ints.shape, ints.dtype) == ((4,), np.float32, (8,), np.int32)
    assert head.ctypes.data == ints.ctypes.data == first.ctypes.data == tensor.data_ptr()
    head[0] = 5.0
    assert tensor[0].item() == 5.0


def test_a_kept_view_holds_the_memory_but_not_the_tensor_or_its_graph():
    import gc
    import weakref

    as_buffer(torch.ones(1), "t")  # the class and dtype are met: the plain-tensor path, which keeps views
    hidden = torch.ones(4, requires_grad=True) * 2.0  # held only by the graph of ``result`` below
    result = hidden.sin()  # sin's backward keeps its input: the graph holds ``hidden``
    held, owner = weakref.ref(hidden), weakref.ref(result)
    del hidden
    view = as_buffer(result, "t", writable=False).array
    del result
    gc.collect()
    assert owner() is None and held() is None
    assert np.allclose(view, np.sin(2.0))  # the memory itself is still there


def test_a_tensor_whose_memory_changes_under_it_gets_a_view_of_its_new_memory():
    """Views are kept per address, size and dtype, read from the tensor at each call: ``.data =``,
    ``set_`` and ``as_strided_`` change those, and the next call sees the tensor as it is now."""
    as_buffer(torch.ones(1), "t")  # the plain-tensor path, which keeps views
    tensor = torch.zeros(4)
    as_buffer(tensor, "t")
    tensor.data = torch.arange(6.0)
    assert as_buffer(tensor, "t").array.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    other = torch.full((3,), 7.0)
    tensor.set_(other)
    got = as_buffer(tensor, "t").array
    assert (got.tolist(), got.ctypes.data) == ([7.0] * 3, other.data_ptr())
    tensor.as_strided_((2,), (2,))  # elements 0 and 2 of the same memory: staged, not a kept view
    buf = as_buffer(tensor, "t")
    assert buf.staged and buf.array.tolist() == [7.0, 7.0]


def test_a_kept_view_is_not_served_once_its_alias_moved_away():
    """``resize_`` moves a storage, and a kept view's alias with it: the old address is freed and
    another tensor may get it, whose memory the kept view would not hold. A kept view whose alias
    is no longer at its address is not served (here the alias is one moved elsewhere: where the
    allocator hands the freed block out again is not the test's to choose)."""
    from pydist.core import buffers

    as_buffer(torch.ones(1), "t")  # the plain-tensor path, which keeps views
    tensor = torch.arange(4.0)
    stale = as_buffer(tensor, "t").array
    key = (tensor.data_ptr(), tensor.nbytes, stale.dtype)
    assert buffers._VIEWS[key][0] is stale
    buffers._VIEWS[key] = (stale, torch.zeros(4))  # its alias now elsewhere, as after a resize_
    fresh = as_buffer(tensor, "t").array
    assert fresh is not stale and fresh.ctypes.data == tensor.data_ptr() and fresh.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert buffers._VIEWS[key][1].data_ptr() == tensor.data_ptr()  # kept again, holding this memory


def test_a_small_slice_of_a_big_storage_is_not_kept():
    """A kept view holds its alias's whole storage: only storages of at most 64 KiB are kept,
    so a small slice of a big batch does not pin the batch."""
    from pydist.core import buffers

    as_buffer(torch.ones(1), "t")
    big = torch.ones(1 << 20)
    as_buffer(big[:16], "t")
    assert all(alias.untyped_storage().nbytes() <= 64 * 1024 for _, alias in buffers._VIEWS.values())
