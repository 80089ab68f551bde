"""A group's shared memory is set up at init (engines.native.prepare), within a bound of its own."""
from __future__ import annotations

import logging
import time

import numpy as np

import pydist
from pydist.core.errors import OpTimeoutError
from pydist.engines import native
from pydist.testing import run_threads


def _sum(rank: int, size: int) -> float:
    t = np.full(4, rank + 1.0, np.float32)
    pydist.all_reduce(t)
    return float(t[0])


def test_a_stuck_set_up_at_init_is_bounded_logged_and_left_to_the_first_operation(monkeypatch, caplog):
    """Where the arena cannot be made at init, init waits PREPARE_SECONDS at most (not the
    group's 1,000 s timeout), logs why, and the first collective makes the arena and runs."""
    waited: list[float] = []
    make = native.NativeEngine._arena_for

    def stuck_at_init(self, ctx, group_ranks):
        if ctx.name == "process group setup":
            waited.append(ctx.deadline.at - time.monotonic())
            raise OpTimeoutError("process group setup: timed out waiting for rank 0 (stand-in)")
        return make(self, ctx, group_ranks)

    monkeypatch.setattr(native.NativeEngine, "_arena_for", stuck_at_init)
    with caplog.at_level(logging.WARNING, logger="pydist"):
        results = run_threads(2, _sum, transport="tcp", pg_timeout=1000, timeout=120)
    assert results == [3.0, 3.0]
    assert len(waited) == 2 and all(seconds <= native.PREPARE_SECONDS for seconds in waited), waited
    assert any("shared memory was not set up at init" in r.getMessage() and "stand-in" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
