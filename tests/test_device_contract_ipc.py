"""The device interface's contract across processes, over every implementation (the strict
stand-in, torch CPU tensors, CUDA where a GPU is present; two processes on device 0): a
buffer exported and opened, the IPC refusals, event ordering with a delayed producer, a
missing wait caught (strict stand-in), two slots reused round after round, a peer that dies
mid-call, one physical device recognised. Each rank is a process (device_support.run_ranks);
host messages between them stand for the engine's control plane."""
from __future__ import annotations

import os

import numpy as np
import pytest
from device_support import ASYNC, KINDS, run_ranks

from pydist.core.deadline import Deadline
from pydist.core.errors import OpTimeoutError, PeerFailedError
from pydist.device import DeviceError, open_device
from pydist.device.dtypes import is_poison

pytestmark = [pytest.mark.device, pytest.mark.slow]

SOON = 30.0  # a deadline that only bounds a hang


def deadline() -> Deadline:
    return Deadline.after(SOON)


# -- a buffer exported, opened, written both ways -------------------------------------------

def _owner(kind, rank, link):
    device = open_device(kind, 0, rank)
    stream = device.current_stream()
    buffer = device.allocate(64)
    view = device.view(buffer, "float32", 8, offset=32)
    device.copy(view, np.arange(8, dtype=np.float32), stream)
    stream.synchronize(deadline())
    link.send(1, device.export(buffer))
    assert link.recv(1) == "written"
    got = device.to_host(view, stream, deadline()).tolist()
    assert link.recv(1) == "closed"
    del view
    device.free(buffer)
    return got


def _opener(kind, rank, link):
    device = open_device(kind, 0, rank)
    stream = device.current_stream()
    mapping = device.open(link.recv(0))
    assert mapping.peer == 0 and mapping.nbytes == 64
    view = device.view(mapping, "float32", 8, offset=32)
    seen = device.to_host(view, stream, deadline()).tolist()
    device.copy(view, np.full(8, -1, np.float32), stream)
    stream.synchronize(deadline())
    link.send(0, "written")
    del view
    device.close(mapping)
    link.send(0, "closed")
    return seen


@pytest.mark.parametrize("kind", KINDS)
def test_a_buffer_is_shared_both_ways(kind):
    owner, opener = run_ranks(kind, [_owner, _opener])
    assert opener == list(range(8)) and owner == [-1.0] * 8


# -- the refusals --------------------------------------------------------------------------

def _refusing_owner(kind, rank, link):
    device = open_device(kind, 0, rank)
    buffer = device.allocate(64)
    old = device.export(buffer)
    link.send(1, old)
    assert link.recv(1) == "opened"
    with pytest.raises(DeviceError, match=r"rank 1 \(pid \d+\) still has it open"):
        device.free(buffer)  # freeing exported memory before the importer closes it is UB
    link.send(1, "tried")
    assert link.recv(1) == "closed"
    device.free(buffer)
    again = device.allocate(64)  # maybe at the same address: never the same handle
    new = device.export(again)
    assert new != old
    link.send(1, (old, new))
    assert link.recv(1) == "done"
    device.free(again)


def _refusing_opener(kind, rank, link):
    device = open_device(kind, 0, rank)
    handle = link.recv(0)
    mapping = device.open(handle)
    with pytest.raises(DeviceError, match="already: reuse that mapping"):
        device.open(handle)
    with pytest.raises(DeviceError, match="cannot be exported again"):
        device.export(mapping)
    with pytest.raises(DeviceError, match="close it instead"):
        device.free(mapping)
    view = device.view(mapping, "uint8")
    link.send(0, "opened")
    assert link.recv(0) == "tried"
    with pytest.raises(DeviceError, match="still in use"):
        device.close(mapping)
    del view
    device.close(mapping)
    with pytest.raises(DeviceError, match="already closed"):
        device.close(mapping)
    link.send(0, "closed")
    old, new = link.recv(0)
    with pytest.raises(DeviceError, match="freed that buffer"):
        device.open(old)
    device.close(device.open(new))
    link.send(0, "done")


@pytest.mark.parametrize("kind", KINDS)
def test_ipc_rules_are_enforced(kind):
    run_ranks(kind, [_refusing_owner, _refusing_opener])


# -- events across processes -----------------------------------------------------------------

def _delayed_producer(kind, rank, link, seconds, wait):
    """Shares a buffer and an event; then, on a stream held back ``seconds``, writes new
    values and records the event, and says so at once (the write has not happened yet)."""
    device = open_device(kind, 0, rank)
    buffer, written = device.allocate(32), device.event(interprocess=True)
    slot = device.view(buffer, "float32")
    device.copy(slot, np.zeros(8, np.float32), device.current_stream())
    device.current_stream().synchronize(deadline())
    link.send(1, (device.export(buffer), written.export()))
    assert link.recv(1) == "opened"
    stream = device.new_stream()
    device.delay(seconds, stream)
    source = device.from_host(np.arange(1, 9, dtype=np.float32), "float32", stream)
    device.copy(slot, source, stream)
    written.record(stream)
    link.send(1, "recorded")
    assert link.recv(1) == "read"
    stream.synchronize(deadline())
    del slot, source
    device.free(buffer)


def _waiting_consumer(kind, rank, link, seconds, wait):
    device = open_device(kind, 0, rank)
    handle, event_handle = link.recv(0)
    mapping, written = device.open(handle), device.open_event(event_handle)
    peer_slot = device.view(mapping, "float32")
    link.send(0, "opened")
    assert link.recv(0) == "recorded"
    stream = device.new_stream()
    if wait:
        stream.wait_event(written)
    del written  # the stream's wait outlives the event object
    out = device.empty((8,), "float32")
    device.copy(out, peer_slot, stream)
    got = device.to_host(out, stream, deadline())
    del peer_slot
    device.close(mapping)
    link.send(0, "read")
    return got


@pytest.mark.parametrize("kind", KINDS)
def test_a_consumer_waiting_on_the_event_reads_the_delayed_write(kind):
    _, got = run_ranks(kind, [_delayed_producer, _waiting_consumer], 0.3, True, timeout=60)
    assert got.tolist() == list(range(1, 9))


def test_a_missing_wait_on_the_peers_event_reads_poison():
    """The strict stand-in runs the producer's write only when someone waits for its event:
    a consumer that forgot ``wait_event`` reads poison, on every run. (CUDA would mostly read
    the zeros, sometimes the values: the reason for the stand-in.)"""
    _, got = run_ranks("standin", [_delayed_producer, _waiting_consumer], 0.0, False)
    assert np.isnan(got).all() and is_poison(got.view(np.uint32), "float32").all()


# -- two slots reused round after round -----------------------------------------------------

ROUNDS = 6


def _slot_writer(kind, rank, link, wait_for_reader):
    """Writes round k into slot k % 2, but only once the reader is done with the round two
    before (its "read" event, imported): with one slot it could never run ahead."""
    device = open_device(kind, 0, rank)
    buffer = device.allocate(2 * 16)
    slots = [device.view(buffer, "int32", 4, offset=16 * i) for i in range(2)]
    written = [device.event(interprocess=True) for _ in range(2)]
    link.send(1, (device.export(buffer), [e.export() for e in written]))
    read = [device.open_event(h) for h in link.recv(1)]
    stream = device.new_stream()
    sources = []
    for k in range(ROUNDS):
        if k >= 2:
            assert link.recv(1) == ("read", k - 2)  # the reader recorded "read" for round k - 2
            if wait_for_reader:
                stream.wait_event(read[k % 2])
        device.delay(0.02, stream)
        sources.append(device.from_host(np.full(4, k, np.int32), "int32", stream))
        device.copy(slots[k % 2], sources[-1], stream)
        written[k % 2].record(stream)
        link.send(1, ("written", k))
    for k in range(ROUNDS - 2, ROUNDS):
        assert link.recv(1) == ("read", k)
    stream.synchronize(deadline())
    assert link.recv(1) == "closed"
    del slots, sources
    device.free(buffer)


def _slot_reader(kind, rank, link, wait_for_reader):
    device = open_device(kind, 0, rank)
    handle, written_handles = link.recv(0)
    mapping = device.open(handle)
    slots = [device.view(mapping, "int32", 4, offset=16 * i) for i in range(2)]
    written = [device.open_event(h) for h in written_handles]
    read = [device.event(interprocess=True) for _ in range(2)]
    link.send(0, [e.export() for e in read])
    stream = device.new_stream()
    out = device.empty((ROUNDS, 4), "int32")
    for k in range(ROUNDS):
        assert link.recv(0) == ("written", k)
        stream.wait_event(written[k % 2])
        device.copy(out[k], slots[k % 2], stream)
        read[k % 2].record(stream)
        link.send(0, ("read", k))
    got = device.to_host(out, stream, deadline())
    del slots
    device.close(mapping)
    link.send(0, "closed")
    return got


@pytest.mark.parametrize("kind", KINDS)
def test_two_slots_are_reused_round_after_round(kind):
    _, got = run_ranks(kind, [_slot_writer, _slot_reader], True, timeout=60)
    assert got.tolist() == [[k] * 4 for k in range(ROUNDS)]


def test_a_slot_rewritten_without_waiting_for_its_reader_is_caught():
    """The writer skips the wait on the reader's "read" event: the stand-in poisons what the
    pending rewrite will overwrite, so the reader's late read of the older round sees poison."""
    _, got = run_ranks("standin", [_slot_writer, _slot_reader], False, timeout=60)
    assert is_poison(got, "int32").any()


# -- a peer that dies mid-call ----------------------------------------------------------------

def _dying_producer(kind, rank, link):
    device = open_device(kind, 0, rank)
    written = device.event(interprocess=True)
    link.send(1, written.export())
    stream = device.new_stream()
    device.delay(5.0, stream)  # the write never comes: this process dies first
    written.record(stream)
    link.send(1, "recorded")
    assert link.recv(1) == "waiting"
    os._exit(0)


def _surviving_consumer(kind, rank, link):
    device = open_device(kind, 0, rank)
    written = device.open_event(link.recv(0))
    assert link.recv(0) == "recorded"
    stream = device.new_stream()
    stream.wait_event(written)
    link.send(0, "waiting")
    with pytest.raises(PeerFailedError, match=r"rank 0 \(pid \d+\) exited") as caught:
        stream.synchronize(Deadline.after(5.0), "the collective's copy")  # not OpTimeoutError: named before 5 s
    assert caught.value.rank == 0
    with pytest.raises((PeerFailedError, OpTimeoutError)):
        written.synchronize(Deadline.after(1.0))
    return str(caught.value)


@pytest.mark.parametrize("kind", KINDS)
def test_a_peer_dying_mid_call_is_named_by_the_deadline(kind):
    if kind not in ASYNC:
        pytest.skip(f"{kind} records complete at once: no call is ever in flight")
    _, message = run_ranks(kind, [_dying_producer, _surviving_consumer], dies=frozenset({0}))
    assert "the collective's copy" in message


# -- identity -------------------------------------------------------------------------------------

def _uuid(kind, rank, link):
    return open_device(kind, 0, rank).uuid


@pytest.mark.parametrize("kind", KINDS)
def test_processes_on_one_device_agree_on_its_uuid(kind):
    first, second = run_ranks(kind, [_uuid, _uuid])
    assert first == second and first
