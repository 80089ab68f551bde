"""Shared by the misuse tests (test_misuse_*.py, test_misuse_size_mismatch.py, test_timeouts_explained.py).

Misuse (DESIGN: "Errors say whose fault it is") must raise a clear ValueError/TypeError at the
call, before anything is sent (so nothing hangs: only the misusing rank makes the call), name
the argument, and leave the group usable: ``run2`` ends every such test with a real
all_reduce on all ranks, which also proves the failed call consumed no sequence number.
Ranks are threads (loopback and tcp transports) for most tests and real processes where the
process matters; the rank functions shared with processes are in tests/seed_programs/misuse.py.
"""
from __future__ import annotations

import time
from datetime import timedelta

import numpy as np
import pytest
from seed_programs import misuse  # noqa: F401 - re-exported for the test modules

import pydist as dist
from pydist.testing import run_threads

try:
    import torch
except ImportError:  # torch is optional: the torch cases skip (LIBS, pytest.importorskip)
    torch = None

TRANSPORTS = ["loopback", "tcp"]
#: Bounds every init call of the misuse tests, in case a check comes too late: a misuse error
#: found only by blocking until the timeout would take SHORT.
SHORT = timedelta(seconds=120)
#: A misuse error must come at once. FAST is far below SHORT (so a check that blocks until the
#: timeout fails) and far above any scheduling delay on a loaded machine (so it never flakes).
FAST = 30.0
#: Tensor libraries of the tests that run on both; "torch" skips without torch.
LIBS = ["numpy", pytest.param("torch", marks=pytest.mark.skipif(torch is None, reason="torch is not installed"))]


@pytest.fixture(params=TRANSPORTS)
def transport(request) -> str:
    return request.param


@pytest.fixture(autouse=True)
def clean_process_world():
    """Tests that init in the main thread must not leave the process-wide group behind."""
    assert not dist.is_initialized()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def run2(fn, transport: str, size: int = 2, pg_timeout: float = 10.0):
    """Run ``fn(rank, size)`` on thread-ranks, then check the group still works."""

    def body(rank: int, size: int):
        value = fn(rank, size)
        tensor = np.arange(3.0) + rank
        dist.all_reduce(tensor)
        expected = sum(np.arange(3.0) + r for r in range(size))
        assert tensor.tolist() == expected.tolist(), "the group is unusable after the misuse error"
        return value

    return run_threads(size, body, transport=transport, timeout=60, pg_timeout=pg_timeout)


def ro(values=(1.0, 2.0)) -> np.ndarray:
    """A read-only float64 array."""
    array = np.array(values)
    array.flags.writeable = False
    return array


def quick(call, exc, match):
    """``call()`` raises ``exc`` matching ``match``, within FAST seconds, and leaves no group."""
    start = time.monotonic()
    with pytest.raises(exc, match=match) as info:
        call()
    assert time.monotonic() - start < FAST, f"took {time.monotonic() - start:.2f} s: {info.value}"
    assert not dist.is_initialized()
    return info.value
