"""A /dev/shm too small or full (Docker's default is 64 MiB, and another user can fill it):
a segment's space is reserved when it is made, so the failure is there, with an error naming
the directory, the bytes asked and free, and what to do; the group's members then go
without shared memory together (right results over the network transport), never SIGBUS.

In-process tests point the segments at a small tmpfs mounted for the test; the slow ones
run ranks as processes in a private mount namespace whose /dev/shm is a small tmpfs."""
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pydist as dist
from pydist.core import shm_files
from pydist.core.deadline import Deadline
from pydist.testing import run_threads
from pydist.transport.shm import atomics as _atomics
from pydist.transport.shm.seal import Binding
from pydist.transport.shm.segment import Segment, SharedMemoryFull
from pydist.transport.shm.sharing import share

pytestmark = [pytest.mark.adversarial,
              pytest.mark.skipif(not _atomics.available(), reason="no libatomic/futex: shared memory is off"),
              pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")]

SCRIPT = Path(__file__).parent / "run_scripts" / "small_shm_ranks.py"


@pytest.fixture
def small_shm(tmp_path, monkeypatch):
    """A 2 MiB tmpfs where this process makes its segments; unmounted at teardown."""
    directory = tmp_path / "shm"
    directory.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=1777", "tmpfs", str(directory)], check=True)
    monkeypatch.setattr(shm_files, "SHM_DIR", str(directory))
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_a_segment_larger_than_the_room_left_is_a_clear_error_at_creation(small_shm):
    binding = Binding("shm/arena/1/0,1", "world", 4 << 20, None)
    with pytest.raises(SharedMemoryFull) as error:
        Segment.create("world", "arena", binding)
    message = str(error.value)
    assert f"{small_shm} has no room for a shared-memory segment (arena) of {(4 << 20) + 4096} bytes" in message
    assert f"{2 << 20} bytes are free" in message
    assert "--shm-size" in message and "PYDIST_SHM=0" in message
    assert list(small_shm.iterdir()) == []  # the file it began is gone


def test_the_members_go_without_shared_memory_together(small_shm, caplog):
    store = dist.HashStore()
    with caplog.at_level(logging.WARNING, "pydist"):
        made = share(store, "shm/arena/2/0,1", [0, 1], 0, 4 << 20, "world", "arena", Deadline.after(5))
    assert made is None
    assert share(store, "shm/arena/2/0,1", [0, 1], 1, 4 << 20, "world", "arena", Deadline.after(5)) is None
    assert "has no room" in caplog.text and "go without shared memory" in caplog.text


def test_an_outsiders_unavailable_mark_is_refused_when_the_job_has_a_secret(monkeypatch):
    """The 'unavailable' mark carries a MAC with the job's secret: a forged one (plain, or
    another job's) is refused like any name that is not the group's segment."""
    monkeypatch.setenv("PYDIST_AUTH_TOKEN", "s3cret")
    store = dist.HashStore()
    store.set("shm/arena/3/0,1/name", "unavailable")
    with pytest.raises(dist.DistStoreError, match="'unavailable' is not a pydist segment name"):
        share(store, "shm/arena/3/0,1", [0, 1], 1, 4096, "world", "arena", Deadline.after(5))


def _collectives(rank, size):
    x = np.full(1 << 18, rank + 1.0)  # 2 MiB: more than the tmpfs holds
    dist.all_reduce(x)
    group = dist.new_group(list(range(size)))
    y = np.arange(1 << 16, dtype=np.float32) * (rank + 1)
    dist.all_reduce(y, group=group)
    z = np.full(1 << 16, float(rank))
    dist.broadcast(z, src=size - 1)
    return float(x[0]), float(y[-1]), float(z[0])


def test_a_job_in_a_small_dev_shm_gets_right_results(small_shm, monkeypatch):
    """3 thread-ranks whose rings (9 MiB) and arenas (4 MiB each) do not fit in 2 MiB."""
    results = run_threads(3, _collectives, transport="tcp")
    assert results == [(6.0, 6.0 * 65535, 2.0)] * 3
    assert list(small_shm.iterdir()) == []


def _spanning_hosts(rank, size):
    x = np.full(1000, rank + 1.0)
    with pytest.raises(dist.DistBackendError, match="hierarchical all_reduce needs shared memory between this "
                                                     "host's ranks.*/dev/shm had no room"):
        dist.all_reduce(x)


def test_a_group_spanning_hosts_without_room_for_its_arenas_fails_clearly(small_shm):
    """Two "hosts" of 2 ranks whose arenas do not fit: the hierarchical algorithm (chosen on
    every host alike, whatever each host's room) fails naming /dev/shm, not ValueError."""
    run_threads(4, _spanning_hosts, transport="tcp", hosts=["a", "a", "b", "b"])


def _in_small_dev_shm(size: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the ranks script in a private mount namespace whose /dev/shm is a tmpfs of ``size``."""
    command = f'mount -t tmpfs -o size={size},mode=1777 tmpfs /dev/shm && exec "$@"'
    return subprocess.run(["unshare", "-m", "sh", "-c", command, "sh", sys.executable, str(SCRIPT), *args],
                          capture_output=True, text=True, timeout=240,
                          env={**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join(sys.path)})


@pytest.mark.slow
@pytest.mark.parametrize("api, groups, shm, runs", [("pydist", "2", "4m", 10), ("torch", "3", "8m", 14)])
def test_process_ranks_in_a_small_dev_shm_get_right_results_not_sigbus(api, groups, shm, runs):
    """4 process ranks make new groups and all_reduce 4 MiB on the world and on each group,
    in a /dev/shm of a few MiB; before the space was reserved at creation, a rank died of
    SIGBUS (no message) and the job failed."""
    if api == "torch":
        pytest.importorskip("torch")
    done = _in_small_dev_shm(shm, "4", groups, "4", api)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"right results: {runs} of {runs} all_reduces" in done.stdout
    assert "/dev/shm has no room for a shared-memory segment" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("api", ["pydist", "torch"])
def test_torch_new_groups_need_no_more_dev_shm_than_pydists(api):
    """4 ranks, 3 new groups, 4 MiB all_reduces: one set of rings (12 MiB) and an arena per
    group, 30 MiB at the peak through either API, fit in 40 MiB. When each torch group had a
    world of its own, with rings of its own, torch's peak was 56 MiB: some groups went without
    shared memory ("has no room")."""
    if api == "torch":
        pytest.importorskip("torch")
    done = _in_small_dev_shm("40m", "4", "3", "4", api)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "right results: 14 of 14 all_reduces" in done.stdout
    assert "has no room" not in done.stderr, done.stderr
