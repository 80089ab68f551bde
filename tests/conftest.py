"""Suite-wide guard: no test may leave pydist threads, child processes or shared memory behind."""
import multiprocessing
import os
import shutil
import tempfile
import threading
import time

import private_shm
import pytest

from pydist.core.shm_files import pid_alive
from pydist.groups.callbacks import RUNNER

LEAK_GRACE_SECONDS = 5.0


def pytest_configure(config: pytest.Config) -> None:
    """A pytest-xdist worker (``make test`` runs two) gets a /dev/shm of its own (private_shm).
    The programs the tests start get a TMPDIR of the run's own, removed when it ends: torchrun
    leaves a torchelastic_* directory and error files in it per job (~35 a run), and a killed
    pydist-run its attempt directory. pytest's own temporary files stay where they were."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        assert threading.current_thread() is threading.main_thread(), "tests must run in the worker's main thread"
        private_shm.enter()
    else:  # the run's first process: the workers and every program started inherit the TMPDIR
        tempfile.gettempdir()  # fixed for this process first (pytest's tmp_path root)
        config.children_tmpdir = tempfile.mkdtemp(prefix="pydist-tests-")  # type: ignore[attr-defined]
        os.environ["TMPDIR"] = config.children_tmpdir  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    path = getattr(config, "children_tmpdir", None)
    if path is not None:
        shutil.rmtree(path, ignore_errors=True)


def _pydist_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("pydist-") and t.is_alive())


def _shm_segments() -> list[str]:
    try:
        return sorted(name for name in os.listdir("/dev/shm") if name.startswith("pydist"))
    except FileNotFoundError:
        return []


def _ours_or_orphaned(segment: str) -> bool:
    """True unless the segment's creator (the pid its name ends with) is another live
    process: a concurrent test run's segments are not this test's leaks."""
    try:
        pid = int(segment.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return True
    return pid == os.getpid() or not pid_alive(pid)


@pytest.fixture(autouse=True)
def soak_only_when_asked(request):
    """Run a ``soak`` test only under ``-m soak`` (or PYDIST_SOAK=1): the default suite must stay fast."""
    if request.node.get_closest_marker("soak") is None:
        return
    expression = request.config.getoption("markexpr") or ""
    if not os.environ.get("PYDIST_SOAK") and ("soak" not in expression or "not soak" in expression):
        pytest.skip("soak run: use `make soak` or `pytest -m soak` (or PYDIST_SOAK=1)")


@pytest.fixture(autouse=True)
def no_leaks():
    """Fail a test that leaves pydist threads, child processes or /dev/shm segments behind."""
    segments_before = set(_shm_segments())
    yield
    deadline = time.monotonic() + LEAK_GRACE_SECONDS
    while (_pydist_threads() or multiprocessing.active_children()) and time.monotonic() < deadline:
        # Idle completion-callback workers would linger for their idle timeout (a second):
        # tell them to go now. Asked again each round, for workers busy at the first ask.
        RUNNER.release_idle()
        time.sleep(0.005)
    assert _pydist_threads() == [], "pydist threads left running"
    assert multiprocessing.active_children() == [], "child processes left running"
    leaked = sorted(name for name in set(_shm_segments()) - segments_before if _ours_or_orphaned(name))
    assert leaked == [], "shared-memory segments left in /dev/shm"
