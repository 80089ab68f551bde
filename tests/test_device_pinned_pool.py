"""The pinned pool's accounting: bounded, made on demand, reused, waits at the bound (no CUDA)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from pydist.core.deadline import Deadline
from pydist.core.errors import DistBackendError, OpTimeoutError
from pydist.device.pinned_pool import PinnedPool, buffers_for

JOIN_S = 30.0  # only a bound on a hang, never a measurement


def pool(max_buffers: int = 2, freed: list | None = None) -> PinnedPool[np.ndarray]:
    return PinnedPool(64, max_buffers, lambda n: np.zeros(n, np.uint8),
                      None if freed is None else freed.append)


def test_buffers_are_made_on_demand_then_reused():
    p = pool(3)
    assert p.allocated == 0
    first = p.acquire(Deadline(None))
    assert first.nbytes == 64 and p.allocated == 1 and p.out == 1
    p.release(first)
    for _ in range(10):
        again = p.acquire(Deadline(None))
        assert again is first
        p.release(again)
    assert p.allocated == 1 and p.out == 0 and p.peak_out == 1


def test_never_more_than_the_bound():
    p = pool(2)
    held = [p.acquire(Deadline(None)), p.acquire(Deadline(None))]
    assert p.try_acquire() is None and p.allocated == 2
    p.release(held.pop())
    assert p.try_acquire() is not None and p.allocated == 2 and p.peak_out == 2


def test_acquire_at_the_bound_waits_for_a_release():
    p = pool(1)
    held = p.acquire(Deadline(None))
    got: list[np.ndarray] = []
    waiter = threading.Thread(target=lambda: got.append(p.acquire(Deadline.after(JOIN_S))))
    waiter.start()
    while p.waits == 0 and waiter.is_alive():  # until it is waiting
        threading.Event().wait(0.001)
    assert not got
    p.release(held)
    waiter.join(JOIN_S)
    assert got == [held] and p.allocated == 1


def test_a_wait_past_the_deadline_names_the_pool():
    p = pool(1)
    p.acquire(Deadline(None))
    with pytest.raises(OpTimeoutError, match="pinned pool.*all 1 of 64 bytes are out"):
        p.acquire(Deadline.after(0))


def test_releasing_a_foreign_buffer_or_twice_is_refused():
    p = pool(1)
    with pytest.raises(ValueError, match="did not hand out"):
        p.release(np.zeros(64, np.uint8))
    buffer = p.acquire(Deadline(None))
    p.release(buffer)
    with pytest.raises(ValueError, match="did not hand out"):
        p.release(buffer)


def test_close_frees_idle_buffers_now_and_the_rest_on_release():
    freed: list = []
    p = pool(2, freed)
    a, b = p.acquire(Deadline(None)), p.acquire(Deadline(None))
    p.release(a)
    p.close()
    assert freed == [a] and p.allocated == 1
    p.release(b)
    assert freed == [a, b] and p.allocated == 0
    with pytest.raises(DistBackendError, match="after close"):
        p.acquire(Deadline(None))


def test_close_wakes_a_waiter_with_an_error():
    p = pool(1)
    p.acquire(Deadline(None))
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            p.acquire(Deadline.after(JOIN_S))
        except DistBackendError as error:
            errors.append(error)

    waiter = threading.Thread(target=wait)
    waiter.start()
    while p.waits == 0 and waiter.is_alive():
        threading.Event().wait(0.001)
    p.close()
    waiter.join(JOIN_S)
    assert len(errors) == 1 and "after close" in str(errors[0])


def test_a_failing_allocation_changes_no_count():
    def allocate(n: int) -> np.ndarray:
        raise MemoryError("pinned memory exhausted")

    p: PinnedPool[np.ndarray] = PinnedPool(64, 2, allocate)
    with pytest.raises(MemoryError):
        p.acquire(Deadline(None))
    assert p.allocated == 0 and p.out == 0


def test_pool_size_in_buffers():
    assert buffers_for(64 << 20, 4 << 20) == 16 and buffers_for(100, 64) == 1
    with pytest.raises(ValueError, match="holds no buffer"):
        buffers_for(63, 64)
    with pytest.raises(ValueError):
        PinnedPool(64, 0, bytearray)
