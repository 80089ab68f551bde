"""The device interface's contract in one process, over every implementation (the strict
stand-in, torch CPU tensors, CUDA where a GPU is present): memory and views, copies in every
direction with offsets and strided views, reduce_into for every ReduceOp and dtype against
numpy, streams and events, a tensor dropped right after the call, host registration,
identity, and the refusals CUDA leaves undefined. Cross-process parts:
test_device_contract_ipc.py."""
from __future__ import annotations

import numpy as np
import pytest
from device_support import KINDS, NAMES, require, sample, values

from pydist.core.buffers import float32_to_bf16_bits
from pydist.core.deadline import Deadline
from pydist.core.ops import ReduceOp, _make_nccl_premul_sum, postscale
from pydist.device import DeviceError, open_device
from pydist.device.dtypes import dtype, is_poison
from pydist.device.handles import decode, encode

pytestmark = pytest.mark.device

SOON = 30.0  # a deadline that only bounds a hang


@pytest.fixture(params=KINDS)
def device(request):
    require(request.param)
    return open_device(request.param, 0, rank=0)


def deadline() -> Deadline:
    return Deadline.after(SOON)


def upload(device, host: np.ndarray, name: str):
    return device.from_host(host, name, device.current_stream())


def download(device, array) -> np.ndarray:
    return device.to_host(array, device.current_stream(), deadline())


# -- memory and views ----------------------------------------------------------------------

def test_a_buffer_holds_what_is_copied_in_at_any_aligned_offset(device):
    buffer = device.allocate(256)
    stream = device.current_stream()
    whole = device.view(buffer, "uint8")
    device.copy(whole, np.zeros(256, np.uint8), stream)
    part = device.view(buffer, "int32", 5, offset=40)
    device.copy(part, np.arange(1, 6, dtype=np.int32), stream)
    raw = download(device, whole)
    assert raw[40:60].view(np.int32).tolist() == [1, 2, 3, 4, 5]
    assert not raw[:40].any() and not raw[60:].any()
    assert download(device, device.view(buffer, "int32", 5, offset=40)).tolist() == [1, 2, 3, 4, 5]
    del whole, part
    device.free(buffer)


def test_views_are_checked(device):
    buffer = device.allocate(64)
    with pytest.raises(ValueError, match="multiple of 4"):
        device.view(buffer, "float32", 1, offset=2)
    with pytest.raises(ValueError, match="do not fit 64 bytes"):
        device.view(buffer, "float64", 8, offset=8)
    with pytest.raises(TypeError, match="dtype: expected one of"):
        device.view(buffer, "complex64")
    assert device.describe(device.view(buffer, "float16"))[1] == (32,)
    with pytest.raises(ValueError, match="positive int"):
        device.allocate(0)
    device.free(buffer)


def test_free_refuses_while_a_view_lives_and_twice(device):
    buffer = device.allocate(64)
    view = device.view(buffer, "float32")
    with pytest.raises(DeviceError, match="still in use"):
        device.free(buffer)
    del view
    device.free(buffer)
    with pytest.raises(DeviceError, match="already freed"):
        device.free(buffer)


# -- copies --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_host_to_device_to_device_to_host_round_trips(device, name):
    host = sample(name, (3, 5), seed=1)
    first = upload(device, host, name)
    second = device.empty((15,), name)
    device.copy(second, first, device.current_stream())  # device to device, reshaped
    back = download(device, second)
    assert back.dtype == host.dtype and np.array_equal(back.reshape(3, 5), host)


def test_strided_views_in_and_out_of_a_flat_buffer(device):
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    user = upload(device, host, "float32")
    buffer = device.allocate(6 * 4)
    flat = device.view(buffer, "float32", 6)
    stream = device.current_stream()
    device.copy(flat, user[1:3, ::2], stream)  # a non-contiguous source into a flat view
    assert download(device, flat).tolist() == host[1:3, ::2].ravel().tolist()
    device.copy(user[::2, 1::2], flat, stream)  # a flat source into a non-contiguous destination
    expected = host.copy()
    expected[::2, 1::2] = host[1:3, ::2].reshape(2, 3)
    assert np.array_equal(download(device, user), expected)
    strided_host = np.zeros((2, 6), np.float32)
    device.copy(strided_host[:, ::2], user[1:3, 1::2], stream)  # into a strided host array
    stream.synchronize(deadline())
    assert np.array_equal(strided_host[:, ::2], expected[1:3, 1::2]) and not strided_host[:, 1::2].any()
    del flat, user
    device.free(buffer)


def test_copies_check_dtype_shape_and_sides(device):
    stream = device.current_stream()
    a = device.empty((4,), "float32")
    with pytest.raises(TypeError, match="dst is float32, src is int32"):
        device.copy(a, device.empty((4,), "int32"), stream)
    with pytest.raises(TypeError, match="cannot hold float32"):
        device.copy(a, np.zeros(4, np.float64), stream)
    with pytest.raises(ValueError, match="not one element count"):
        device.copy(a, np.zeros(5, np.float32), stream)
    with pytest.raises(TypeError, match="both host arrays"):
        device.copy(np.zeros(4, np.float32), np.zeros(4, np.float32), stream)
    b = device.empty((4, 4), "float32")
    with pytest.raises(ValueError, match="neither is contiguous"):
        device.copy(b[:, ::2], device.empty((4, 4), "float32")[::2, :], stream)
    with pytest.raises(ValueError, match="negative stride"):
        device.copy(a, np.zeros(4, np.float32)[::-1], stream)
    with pytest.raises(ValueError, match="stream: expected a stream of"):
        device.copy(a, np.zeros(4, np.float32), object())


# -- reduce_into: every op and dtype against numpy ------------------------------------------

REDUCE_OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM"]
_NUMPY = {"SUM": np.add, "PRODUCT": np.multiply, "MIN": np.minimum, "MAX": np.maximum,
          "BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}


def _op(name: str, kind_letter: str):
    if name == "PREMUL_SUM":
        return _make_nccl_premul_sum(0.5 if kind_letter == "f" else 3)
    return ReduceOp(getattr(ReduceOp, name))


def _expected(name: str, op: ReduceOp, a: np.ndarray, b: np.ndarray, kind_name: str) -> np.ndarray:
    """numpy's answer: integers and bool in their own type (wrapping), floats exactly in
    float64 and rounded once to the type (the inputs make every result exact)."""
    kind = dtype(kind_name)
    x, y = values(a, kind_name), values(b, kind_name)
    if kind.kind == "f":
        x, y = x.astype(np.float64), y.astype(np.float64)
    if name == "PREMUL_SUM":
        x, y = x * op.factor, y * op.factor
        if kind.kind != "f":
            x, y = x.astype(kind.compute), y.astype(kind.compute)
    result = np.add(x, y) if name in ("AVG", "PREMUL_SUM") else _NUMPY[name](x, y)
    if name == "AVG" and kind.kind == "f":
        result = result / 2
    elif name == "AVG":  # C's division, truncating toward zero (pydist's own host kernel)
        result = result.astype(kind.compute)
        postscale(result, op, 2)
    if kind_name == "bfloat16":
        return float32_to_bf16_bits(result.astype(np.float32))
    return result.astype(kind.compute)


@pytest.mark.parametrize("name", REDUCE_OPS)
def test_reduce_into_every_dtype_against_numpy(device, name):
    stream = device.current_stream()
    checked = []
    for kind_name in NAMES:
        kind = dtype(kind_name)
        op = _op(name, kind.kind)
        a, b = sample(kind_name, (2, 7), seed=2), sample(kind_name, (2, 7), seed=3)
        dst, src = upload(device, a, kind_name), upload(device, b, kind_name)
        invalid = (name in ("BAND", "BOR", "BXOR") and kind.kind == "f") or (
            name in ("AVG", "PREMUL_SUM") and kind.kind == "b")
        if invalid:
            with pytest.raises(TypeError, match=name):
                device.reduce_into(dst, src, op, stream)
            continue
        device.prescale(dst, op, stream)
        device.prescale(src, op, stream)
        device.reduce_into(dst, src, op, stream)
        device.postscale(dst, op, 2, stream)
        got = download(device, dst)
        expected = _expected(name, op, a, b, kind_name)
        assert got.tobytes() == expected.astype(got.dtype).tobytes(), (kind_name, got, expected)
        checked.append(kind_name)
    assert len(checked) == {"BAND": 6, "BOR": 6, "BXOR": 6, "AVG": 9, "PREMUL_SUM": 9}.get(name, 10)


def test_reduce_into_strided_views_and_offsets(device):
    stream = device.current_stream()
    host = np.arange(12, dtype=np.int64).reshape(3, 4)
    user = upload(device, host, "int64")
    buffer = device.allocate(8 * 8)
    acc = device.view(buffer, "int64", 6, offset=16)
    device.copy(acc, np.full(6, 100, np.int64), stream)
    device.reduce_into(acc, user[:, 1::2], ReduceOp.SUM, stream)  # strided source, flat destination
    assert download(device, acc).tolist() == (100 + host[:, 1::2].ravel()).tolist()
    device.reduce_into(user[:, ::2], acc, ReduceOp.MAX, stream)  # flat source, strided destination
    expected = host.copy()
    expected[:, ::2] = np.maximum(host[:, ::2], (100 + host[:, 1::2]))
    assert np.array_equal(download(device, user), expected)
    with pytest.raises(TypeError, match="host array"):
        device.reduce_into(acc, np.zeros(6, np.int64), ReduceOp.SUM, stream)
    with pytest.raises(TypeError, match="ReduceOp"):
        device.reduce_into(acc, acc, "sum", stream)
    with pytest.raises(ValueError, match="group_size"):
        device.postscale(acc, ReduceOp.AVG, 0, stream)
    del acc
    device.free(buffer)


# -- streams and events ---------------------------------------------------------------------

def test_a_never_recorded_event_is_complete(device):
    event = device.event()
    assert event.query()
    event.synchronize(deadline())
    other = device.new_stream()
    other.wait_event(event)  # no wait at all
    out = device.empty((2,), "int32")
    device.copy(out, np.array([4, 5], np.int32), other)
    assert device.to_host(out, other, deadline()).tolist() == [4, 5]


def test_a_stream_waits_for_another_streams_work_through_an_event(device):
    caller, group = device.current_stream(), device.new_stream()
    user = device.from_host(np.arange(8, dtype=np.float32), "float32", caller)
    ready = device.event()
    ready.record(caller)
    group.wait_event(ready)
    buffer = device.allocate(32)
    slot = device.view(buffer, "float32")
    device.copy(slot, user, group)
    device.reduce_into(slot, user, ReduceOp.SUM, group)
    done = device.event()
    done.record(group)
    done.synchronize(deadline())
    assert done.query()
    assert download(device, slot).tolist() == [2.0 * i for i in range(8)]
    del slot
    device.free(buffer)


def test_a_tensor_dropped_right_after_the_call(device):
    """The engine copies a user tensor on its own stream and the caller drops the tensor at
    once: keep_alive (record_stream) keeps its memory until the stream is past it."""
    caller, group = device.current_stream(), device.new_stream()
    buffer = device.allocate(64)
    slot = device.view(buffer, "int64")
    for round_ in range(3):
        user = device.from_host(np.full(8, round_, np.int64), "int64", caller)
        ready = device.event()
        ready.record(caller)
        group.wait_event(ready)
        device.copy(slot, user, group)
        device.keep_alive(user, group)
        del user
        assert download_on(device, slot, group).tolist() == [round_] * 8
    del slot
    device.free(buffer)


def download_on(device, array, stream) -> np.ndarray:
    return device.to_host(array, stream, deadline())


def test_exporting_a_plain_event_or_opening_ones_own_handles_is_refused(device):
    with pytest.raises(DeviceError, match="only an interprocess event"):
        device.event().export()
    shared = device.event(interprocess=True)
    with pytest.raises(DeviceError, match="exported by this process"):
        device.open_event(shared.export())
    buffer = device.allocate(16)
    handle = device.export(buffer)
    assert device.export(buffer) == handle  # one handle per buffer
    with pytest.raises(DeviceError, match="exported by this process"):
        device.open(handle)
    with pytest.raises(DeviceError, match="is of an event"):
        device.open(shared.export())
    forged = decode(handle)
    other_kind = "cuda" if device.kind != "cuda" else "standin"
    with pytest.raises(DeviceError, match=f"comes from a {other_kind} device"):
        device.open(encode(type(forged)(forged.what, other_kind, forged.pid + 1, None, 16, "x", b"", forged.ledger)))
    with pytest.raises(DeviceError, match="not a device handle"):
        device.open(b"garbage")
    device.free(buffer)


# -- host memory and identity -----------------------------------------------------------------

def test_registered_host_memory_takes_copies(device):
    arena = np.zeros(1024, np.uint8)
    with device.register_host(arena) as registration:
        with pytest.raises(DeviceError, match="overlaps"):
            device.register_host(arena[100:200])
        staging = arena[64:96].view(np.float32)
        user = device.from_host(np.arange(8, dtype=np.float32), "float32", device.current_stream())
        device.copy(staging, user, device.current_stream())
        device.current_stream().synchronize(deadline())
        assert staging.tolist() == list(range(8))
        assert registration.span[1] - registration.span[0] == 1024
    with device.register_host(arena):  # unregistered on exit: registrable again
        pass
    with pytest.raises(ValueError, match="C-contiguous"):
        device.register_host(arena[::2])


def test_identity_is_a_stable_uuid(device):
    again = open_device(device.kind, 0, rank=1)
    assert isinstance(device.uuid, str) and device.uuid and device.uuid == again.uuid
    assert "rank 0" in device.where and f"{device.kind}:0" in device.where


# -- what only the strict stand-in can show ------------------------------------------------------

def _strict(device) -> None:
    if not device.strict:
        pytest.skip(f"{device.kind} runs work eagerly or on real hardware: a missing wait is not deterministic")


def test_a_missing_wait_between_streams_reads_poison(device):
    """The group stream copies the user's tensor without waiting on the caller's stream:
    the stand-in's copy reads the caller's not-yet-produced output, which is poison."""
    _strict(device)
    caller, group = device.current_stream(), device.new_stream()
    user = device.from_host(np.arange(4, dtype=np.float32), "float32", caller)
    out = device.empty((4,), "float32")
    device.copy(out, user, group)  # no group.wait_event(...) here: the bug
    device.keep_alive(user, group)
    got = device.to_host(out, group, deadline())
    assert np.isnan(got).all() and is_poison(got.view(np.uint32), "float32").all()


def test_a_host_read_before_the_wait_reads_poison(device):
    _strict(device)
    user = upload(device, np.ones(4, np.int32), "int32")
    host = np.zeros(4, np.int32)
    device.copy(host, user, device.current_stream())
    assert is_poison(host, "int32").all()  # not synchronized yet
    device.current_stream().synchronize(deadline())
    assert host.tolist() == [1, 1, 1, 1]


def test_a_tensor_dropped_without_keep_alive_is_an_error_when_its_work_runs(device):
    _strict(device)
    caller, group = device.current_stream(), device.new_stream()
    user = device.from_host(np.ones(4, np.float32), "float32", caller)
    ready = device.event()
    ready.record(caller)
    group.wait_event(ready)
    out = device.empty((4,), "float32")
    device.copy(out, user, group)
    del user  # no keep_alive: its memory may hold another tensor by the time the copy runs
    with pytest.raises(DeviceError, match="dropped before this work ran"):
        group.synchronize(deadline())
