"""How a recorded operation reads in files: state names, dtype names and sizes, wall-clock
times. Shared by the flight recorder's files (_registry) and the timeline."""
from __future__ import annotations

import time
from typing import Any

STATE_NAMES = ("queued", "started", "completed", "failed")
QUEUED, STARTED, COMPLETED, FAILED = range(4)

# one anchor turns monotonic times into wall-clock times in every file of this process
_WALL_ANCHOR = time.time() - time.monotonic()


def wall(monotonic: float) -> float:
    """The wall-clock time (epoch seconds) of a time.monotonic() reading of this process."""
    return _WALL_ANCHOR + monotonic


def itemsize(dtype: Any) -> int:
    if dtype is None:
        return 0
    if isinstance(dtype, str):
        return 2 if dtype == "bfloat16" else _numpy_itemsize(dtype)
    return dtype.itemsize


def _numpy_itemsize(name: str) -> int:
    import numpy as np
    try:
        return np.dtype(name).itemsize
    except TypeError:
        return 0
