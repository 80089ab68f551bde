"""Suite-wide guard: no test may leave pydist threads, child processes or shared memory behind."""
import multiprocessing
import os
import threading
import time

import pytest

LEAK_GRACE_SECONDS = 5.0


def _pydist_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("pydist-") and t.is_alive())


def _shm_segments() -> list[str]:
    try:
        return sorted(name for name in os.listdir("/dev/shm") if name.startswith("pydist"))
    except FileNotFoundError:
        return []


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail a test that leaves pydist threads, child processes or /dev/shm segments behind."""
    segments_before = set(_shm_segments())
    yield
    deadline = time.monotonic() + LEAK_GRACE_SECONDS
    while (_pydist_threads() or multiprocessing.active_children()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _pydist_threads() == [], "pydist threads left running"
    assert multiprocessing.active_children() == [], "child processes left running"
    assert sorted(set(_shm_segments()) - segments_before) == [], "shared-memory segments left in /dev/shm"
