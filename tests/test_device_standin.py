"""The strict stand-in's own machinery and the pieces every device shares: physical identity
under a CUDA_VISIBLE_DEVICES-like list, the lazy scheduler (captured work seen through an
overlay, poison for racing reads, a sticky failure), the executor thread's life, the handle
envelope, the buffer ledger, /dev/shm files proven ours, and the nudge parser."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from pydist.core import shm_files as core_shm_files
from pydist.core.deadline import Deadline
from pydist.core.errors import OpTimeoutError, PeerFailedError
from pydist.core.ops import ReduceOp
from pydist.device import DeviceError, shm_files
from pydist.device.dtypes import is_poison
from pydist.device.events import Event
from pydist.device.handles import EVENT, MEMORY, Handle, decode, encode
from pydist.device.ledger import Ledger
from pydist.device.standin import StandinDevice
from pydist.device.standin.nudges import parse
from pydist.device.standin.scheduler import BACKLOG

SOON = 30.0  # a deadline that only bounds a hang


def deadline() -> Deadline:
    return Deadline.after(SOON)


def test_the_uuid_names_the_physical_device_whatever_the_visible_list():
    assert StandinDevice(0, visible=[1, 0]).uuid == StandinDevice(0, visible=[1]).uuid == StandinDevice(1).uuid
    assert StandinDevice(0, visible=[0]).uuid != StandinDevice(0, visible=[1]).uuid


def test_work_on_one_stream_sees_its_own_earlier_results_before_anything_runs():
    device = StandinDevice()
    stream = device.current_stream()
    a = device.from_host(np.array([1, 2, 3], np.int32), "int32", stream)
    b = device.empty((3,), "int32")
    device.copy(b, a, stream)  # captured: b is poison until it runs
    device.reduce_into(b, a, ReduceOp.SUM, stream)  # reads b through the pending copy
    device.reduce_into(b, b, ReduceOp.PRODUCT, stream)
    assert is_poison(b.bits, "int32").all()  # nothing ran yet
    assert device.to_host(b, stream, deadline()).tolist() == [4, 16, 36]


def test_a_stream_keeps_at_most_its_backlog_waiting():
    device = StandinDevice()
    stream = device.current_stream()
    acc = device.from_host(np.zeros(8, np.int64), "int64", stream)
    one = device.from_host(np.ones(8, np.int64), "int64", stream)
    for _ in range(3 * BACKLOG):
        device.reduce_into(acc, one, ReduceOp.SUM, stream)
        assert len(stream.pending) <= BACKLOG
    assert device.to_host(acc, stream, deadline()).tolist() == [3 * BACKLOG] * 8


def test_a_racing_read_of_a_pending_write_sees_poison_and_an_ordered_one_the_value():
    device = StandinDevice()
    first, second = device.new_stream(), device.new_stream()
    buffer = device.allocate(16)
    slot = device.view(buffer, "float32")
    device.copy(slot, np.full(4, 7, np.float32), first)
    written = device.event()
    written.record(first)
    racing, ordered = np.zeros(4, np.float32), np.zeros(4, np.float32)
    device.copy(racing, slot, second)  # not ordered after the write
    second.wait_event(written)
    device.copy(ordered, slot, second)
    second.synchronize(deadline())
    assert np.isnan(racing).all() and ordered.tolist() == [7.0] * 4
    del slot
    device.free(buffer)


def test_a_failed_operation_fails_every_later_wait_on_its_stream():
    device = StandinDevice()
    caller, group = device.current_stream(), device.new_stream()
    user = device.from_host(np.ones(2, np.float32), "float32", caller)
    ready = device.event()
    ready.record(caller)
    group.wait_event(ready)
    device.copy(np.zeros(2, np.float32), user, group)
    del user
    for _ in range(2):  # sticky, as a CUDA error is
        with pytest.raises(DeviceError, match="dropped before this work ran"):
            group.synchronize(deadline())


def test_a_delay_holds_the_stream_back():
    device = StandinDevice()
    stream = device.current_stream()
    device.delay(0.05, stream)
    host = np.zeros(1, np.int64)
    device.copy(host, device.from_host(np.array([5]), "int64", stream), stream)
    assert not stream.query() or host.tolist() == [5]  # the delay may already be over on a slow machine
    stream.synchronize(deadline())
    assert host.tolist() == [5]


def test_memory_cannot_be_freed_under_work_not_yet_run():
    device = StandinDevice()
    stream = device.new_stream()
    buffer = device.allocate(16)
    device.copy(device.view(buffer, "int32"), np.arange(4, dtype=np.int32), stream)  # the view is dropped
    with pytest.raises(DeviceError, match=r"free on standin:0: .*\(1 operation not yet run\)"):
        device.free(buffer)
    stream.synchronize(deadline())
    device.free(buffer)


def test_host_memory_cannot_be_unregistered_under_a_queued_copy():
    device = StandinDevice()
    arena = np.zeros(16, np.float32)
    registration = device.register_host(arena)
    device.copy(arena[:4], device.from_host(np.ones(4, np.float32), "float32", device.current_stream()),
                device.current_stream())
    with pytest.raises(DeviceError, match="queued copies still use"):
        registration.unregister()
    device.current_stream().synchronize(deadline())
    registration.unregister()


def _executor_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "pydist-device-standin"]


def test_the_executor_thread_lives_as_long_as_an_interprocess_event():
    device = StandinDevice()
    assert _executor_threads() == []
    events = [device.event(interprocess=True), device.event(interprocess=True)]
    assert _executor_threads() == ["pydist-device-standin"]
    events.pop()
    assert _executor_threads() == ["pydist-device-standin"]
    events.pop()
    assert _executor_threads() == []


def test_a_stand_in_array_slices_like_a_tensor():
    device = StandinDevice()
    array = device.empty((4, 6), "bfloat16")
    assert array[1:3, ::2].shape == (2, 3) and not array[1:3, ::2].is_contiguous() and array.dtype == "bfloat16"
    assert array.reshape(24).shape == (24,) and len(array) == 4 and array[1].shape == (6,)
    with pytest.raises(ValueError, match="negative step"):
        array[::-1]
    with pytest.raises(TypeError, match="ints and slices"):
        array[[0, 1]]
    with pytest.raises(TypeError, match="not on the host"):
        array[0, 0]
    with pytest.raises(ValueError, match="non-contiguous"):
        array[:, ::2].reshape(12)
    with pytest.raises(ValueError, match="not on StandinDevice"):
        StandinDevice().describe(array)


# -- the shared pieces ------------------------------------------------------------------------

class _NeverDone(Event):
    """An event whose work never completes (a device stream stuck on a dead peer's event)."""

    failing = False

    def _record(self, stream):
        pass

    def query(self):
        if self.failing:
            raise self.device.error("cudaEventQuery", "an illegal memory access was encountered")
        return False

    def _payload(self):
        return b""


def test_a_wait_on_work_that_waits_on_a_dead_peer_names_the_peer():
    """What CUDA's streams rely on (the stand-in's own scheduler names the peer itself): an
    event recorded after a wait on a peer's event fails naming that peer once it is dead,
    before the deadline, even when CUDA's query itself errs; a live peer's error stays."""
    device = StandinDevice(rank=1)
    stream = device.new_stream()
    stream.peers[4242] = Handle(EVENT, "standin", _dead_pid(), 3, 0, "GPU-x", b"")
    event = _NeverDone(device, False)
    event.record(stream)
    for failing in (False, True):
        event.failing = failing
        with pytest.raises(PeerFailedError, match=r"rank 1, standin:0: rank 3 \(pid \d+\) exited") as caught:
            event.synchronize(Deadline.after(SOON), "the group's copy")
        assert caught.value.rank == 3
    event.peers = {}
    with pytest.raises(DeviceError, match="illegal memory access"):
        event.synchronize(Deadline.after(SOON))
    event.failing = False
    with pytest.raises(OpTimeoutError, match="not complete by the deadline"):
        event.synchronize(Deadline.after(0.01))


def test_a_handle_round_trips_and_a_malformed_one_says_what_is_wrong():
    handle = Handle(MEMORY, "standin", 123, 4, 4096, "GPU-x", b"payload", shm_files.new_name("l"))
    data = encode(handle)
    assert decode(data) == handle and handle.exporter == "rank 4 (pid 123)"
    for mangled, message in ((data[:10], "bytes, got 10"), (b"XXXX" + data[4:], "magic"),
                             (data[:4] + b"\x09" + data[5:], "version 9"),
                             (data[:5] + b"z" + data[6:], "unknown kind"), (data + b"x", "header says"),
                             (data.replace(b"pydist-dl", b"pydist-..", 1), "not a pydist")):
        with pytest.raises(ValueError, match=message):
            decode(mangled)


def test_device_files_are_only_opened_when_they_are_ours():
    name = shm_files.new_name("m")
    fd, mapped = shm_files.create(name, 64)
    try:
        os.close(fd)
        mapped.close()
        with pytest.raises(ValueError, match="it has 64 bytes, expected 128"):
            shm_files.attach(name, 128)
        os.chmod(os.path.join(core_shm_files.SHM_DIR, name), 0o644)
        with pytest.raises(ValueError, match="its mode 0644 lets other users in"):
            shm_files.attach(name, 64)
    finally:
        shm_files.unlink(name)
    for bad in ("../etc/passwd", "pydist-dm-0123456789abcdef-1/x", "pydist-dm-short-1"):
        with pytest.raises(ValueError, match="not a pydist device file name"):
            shm_files.check_name(bad)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_files_of_a_dead_creator_are_removed():
    name = f"pydist-dm-{'ab' * 8}-{_dead_pid()}"
    with open(os.path.join(core_shm_files.SHM_DIR, name), "wb"):
        pass
    assert name in shm_files.remove_stale()
    assert not core_shm_files.pid_alive(_dead_pid()) and core_shm_files.pid_alive(os.getpid())


def test_the_ledger_counts_live_openers_only():
    ledger = Ledger.create()
    opener = Ledger.attach(ledger.name)
    try:
        at = 64  # the first slot: pid, rank of a process that has it open
        opener._map[at:at + 8] = np.array([_dead_pid(), 5], np.int32).tobytes()
        assert ledger.openers() == []  # a dead opener does not count
        opener._map[at:at + 8] = np.array([os.getppid(), 5], np.int32).tobytes()
        assert ledger.openers() == [(os.getppid(), 5)]
        with pytest.raises(ValueError, match=r"rank 5 \(pid \d+\) still has it open"):
            ledger.retire()
        opener._map[at:at + 8] = bytes(8)
        ledger.register(None)
        with pytest.raises(ValueError, match="open already"):
            ledger.register(None)
        ledger.retire()  # this process itself does not count
        with pytest.raises(ValueError, match="freed"):
            opener.register(1)
    finally:
        opener.close()
        ledger.close()
        shm_files.unlink(ledger.name)


def test_nudges_are_parsed_strictly():
    name = shm_files.new_name("e")
    assert parse(name.encode() + (7).to_bytes(8, "big")) == (name, 7)
    for junk in (b"", b"\x00" * 8, b"../x" + bytes(8), b"\xff" * 40):
        assert parse(junk) is None
