"""The staged path's chunk schedule with fake copies that run only when waited for (no CUDA):
three chunks in flight, the pool's bound held, network steps in chunk order, no deadlock."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from pydist.core.deadline import Deadline
from pydist.core.errors import OpTimeoutError
from pydist.device.pinned_pool import PinnedPool
from pydist.device.staged_schedule import Chunk, cut, run_staged

JOIN_S = 30.0  # only a bound on a hang, never a measurement


class FakeCopy:
    """A started copy that happens when waited for (as an async device copy may happen any
    time before its event completes): a schedule that reads a buffer too early sees stale bytes."""

    def __init__(self, device: FakeDevice, kind: str, chunk: Chunk, action):
        self.device, self.kind, self.chunk, self.action, self.done = device, kind, chunk, action, False
        device.in_flight.add((kind, chunk.index))
        device.log.append((f"{kind} start", chunk.index))

    def wait(self, deadline: Deadline) -> None:
        if self.device.stuck == (self.kind, self.chunk.index):
            raise OpTimeoutError(f"{self.kind} of chunk {self.chunk.index} did not complete")
        if not self.done:
            self.action()
            self.done = True
            self.device.in_flight.discard((self.kind, self.chunk.index))
            self.device.log.append((f"{self.kind} done", self.chunk.index))


class FakeDevice:
    """A 'device tensor' as numpy bytes; the network step adds 1 to every byte of a chunk."""

    def __init__(self, nbytes: int, fail_network_at: int | None = None, stuck: tuple[str, int] | None = None):
        self.tensor = (np.arange(nbytes) % 251).astype(np.uint8)
        self.expected = self.tensor + 1
        self.log: list[tuple[str, int]] = []
        self.in_flight: set[tuple[str, int]] = set()
        self.during_network: dict[int, set[tuple[str, int]]] = {}
        self.fail_network_at = fail_network_at
        self.stuck = stuck
        self.copies: list[FakeCopy] = []

    def _view(self, chunk: Chunk) -> np.ndarray:
        return self.tensor[chunk.offset:chunk.offset + chunk.nbytes]

    def copy_down(self, chunk: Chunk, buffer: np.ndarray) -> FakeCopy:
        def action() -> None:
            buffer[:chunk.nbytes] = self._view(chunk)
        copy = FakeCopy(self, "down", chunk, action)
        self.copies.append(copy)
        return copy

    def network(self, chunk: Chunk, buffer: np.ndarray) -> None:
        self.during_network[chunk.index] = set(self.in_flight)
        self.log.append(("net", chunk.index))
        if chunk.index == self.fail_network_at:
            raise ConnectionError(f"peer gone at chunk {chunk.index}")
        buffer[:chunk.nbytes] += 1

    def copy_up(self, chunk: Chunk, buffer: np.ndarray) -> FakeCopy:
        def action() -> None:
            self._view(chunk)[:] = buffer[:chunk.nbytes]
        copy = FakeCopy(self, "up", chunk, action)
        self.copies.append(copy)
        return copy

    def run(self, pool: PinnedPool, chunk_bytes: int, deadline: Deadline | None = None) -> None:
        run_staged(cut(self.tensor.nbytes, chunk_bytes), pool, self.copy_down, self.network, self.copy_up,
                   deadline or Deadline(None))


def make_pool(max_buffers: int, buffer_bytes: int = 16) -> PinnedPool[np.ndarray]:
    return PinnedPool(buffer_bytes, max_buffers, lambda n: np.full(n, 0xEE, np.uint8))


def test_cut_on_element_boundaries():
    assert cut(0, 8) == []
    assert [(c.offset, c.nbytes) for c in cut(10, 4)] == [(0, 4), (4, 4), (8, 2)]
    assert [(c.offset, c.nbytes) for c in cut(24, 10, itemsize=4)] == [(0, 8), (8, 8), (16, 8)]
    assert [c.index for c in cut(9, 3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="holds no element"):
        cut(8, 2, itemsize=4)
    with pytest.raises(ValueError, match="in elements of 4"):
        cut(10, 8, itemsize=4)


@pytest.mark.parametrize("nbytes", [0, 1, 15, 16, 17, 100, 160])
@pytest.mark.parametrize("max_buffers", [1, 2, 3, 5])
def test_every_byte_comes_back_through_the_network_step(nbytes, max_buffers):
    device, pool = FakeDevice(nbytes), make_pool(max_buffers)
    device.run(pool, 16)
    assert np.array_equal(device.tensor, device.expected)
    chunks = len(cut(nbytes, 16))
    assert [i for kind, i in device.log if kind == "net"] == list(range(chunks))  # in order
    assert pool.out == 0 and pool.allocated <= max_buffers and pool.peak_out <= min(3, max_buffers)
    assert all(copy.done for copy in device.copies)  # every started copy was waited for


def test_three_chunks_in_flight_while_one_is_on_the_network():
    device, pool = FakeDevice(6 * 16), make_pool(8)
    device.run(pool, 16)
    for k in range(1, 5):  # chunk k+1 comes down and chunk k-1 goes up while k is on the network
        assert {("down", k + 1), ("up", k - 1)} <= device.during_network[k], (k, device.during_network[k])
    assert ("down", 1) in device.during_network[0] and ("up", 4) in device.during_network[5]
    assert pool.peak_out == 3 and pool.allocated == 3


def test_two_buffers_still_overlap_coming_down_with_the_network():
    device, pool = FakeDevice(5 * 16), make_pool(2)
    device.run(pool, 16)
    for k in range(4):
        assert ("down", k + 1) in device.during_network[k]
    assert pool.peak_out == 2


def test_one_buffer_goes_chunk_by_chunk():
    device, pool = FakeDevice(4 * 16), make_pool(1)
    device.run(pool, 16)
    assert all(not flight for flight in device.during_network.values())
    assert np.array_equal(device.tensor, device.expected) and pool.allocated == 1


def test_the_pool_is_reused_across_calls():
    pool = make_pool(4)
    for _ in range(5):
        device = FakeDevice(10 * 16)
        device.run(pool, 16)
        assert np.array_equal(device.tensor, device.expected)
    assert pool.allocated == 3 and pool.out == 0


def test_a_chunk_larger_than_the_buffers_is_refused_before_anything_starts():
    device, pool = FakeDevice(64), make_pool(2, buffer_bytes=16)
    with pytest.raises(ValueError, match="exceeds the pool's 16-byte buffers"):
        device.run(pool, 32)
    assert device.log == [] and pool.allocated == 0


def test_a_call_waits_for_buffers_another_holds_and_never_exceeds_the_bound():
    pool = make_pool(1)
    other = pool.acquire(Deadline(None))  # another call of the group holds the only buffer
    device = FakeDevice(3 * 16)
    runner = threading.Thread(target=device.run, args=(pool, 16, Deadline.after(JOIN_S)))
    runner.start()
    while pool.waits == 0 and runner.is_alive():
        threading.Event().wait(0.001)
    assert device.log == [] and pool.allocated == 1  # waiting, holding none, allocating none
    pool.release(other)
    runner.join(JOIN_S)
    assert np.array_equal(device.tensor, device.expected) and pool.allocated == 1 and pool.out == 0


def test_calls_sharing_a_small_pool_all_finish():
    pool = make_pool(2)
    devices = [FakeDevice(9 * 16 + 3) for _ in range(4)]
    errors: list[BaseException] = []

    def run(device: FakeDevice) -> None:
        try:
            device.run(pool, 16, Deadline.after(JOIN_S))
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(device,)) for device in devices]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert not errors and not any(t.is_alive() for t in threads)
    assert all(np.array_equal(d.tensor, d.expected) for d in devices)
    assert pool.allocated <= 2 and pool.out == 0


def test_a_failing_network_step_waits_for_started_copies_and_returns_the_buffers():
    device, pool = FakeDevice(6 * 16, fail_network_at=2), make_pool(3)
    with pytest.raises(ConnectionError, match="chunk 2"):
        device.run(pool, 16)
    assert pool.out == 0 and all(copy.done for copy in device.copies)
    assert [i for kind, i in device.log if kind == "net"] == [0, 1, 2]


def test_a_copy_that_never_completes_keeps_its_buffer_out_of_the_pool():
    device, pool = FakeDevice(6 * 16, stuck=("up", 1)), make_pool(3)
    with pytest.raises(OpTimeoutError, match="up of chunk 1"):
        device.run(pool, 16)
    assert pool.out >= 1  # not reused under a copy that may still write it
    assert pool.try_acquire() is not None or pool.out == pool.max_buffers
