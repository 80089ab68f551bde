"""Attack: entries planted in /dev/shm under the device layer's names (pydist-d<kind>-...).
The device layer's stale-file clean-up runs before each of its files is made, so an entry it
cannot understand must neither raise nor be removed when it is not this user's own file, and
a /dev/shm without room must fail at creation (never SIGBUS at a later write)."""
import os
import subprocess

import pytest
import shm_planting

from pydist.core import shm_files as core_files
from pydist.core.shm_files import SharedMemoryFull
from pydist.device import shm_files

pytestmark = pytest.mark.adversarial

@pytest.fixture
def planted():
    """Device-named entries another user could leave, every creator gone or impossible."""
    with shm_planting.planted({
        "huge pid": f"/dev/shm/pydist-dl-{'a' * 16}-{'9' * 10}",
        "directory": f"/dev/shm/pydist-dm-{'b' * 16}-4194000",
        "other user's": f"/dev/shm/pydist-de-{'c' * 16}-4194001",
        "symlink": f"/dev/shm/pydist-dm-{'d' * 16}-4194002",
    }) as paths:
        yield paths


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's file needs root")
def test_device_clean_up_leaves_planted_entries_alone_and_does_not_raise(planted):
    removed = shm_files.remove_stale()
    assert not set(removed) & {os.path.basename(p) for p in planted.values()}
    assert [what for what, path in planted.items() if not os.path.lexists(path)] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="planting another user's file needs root")
def test_a_device_file_is_made_beside_planted_entries(planted):
    name = shm_files.new_name("l")
    fd, mapped = shm_files.create(name, 4096)
    try:
        mapped[:4] = b"ours"
    finally:
        mapped.close()
        os.close(fd)
        shm_files.unlink(name)


def test_pid_alive_answers_for_any_number():
    assert core_files.pid_alive(os.getpid())
    assert not core_files.pid_alive(int("9" * 20))
    assert not core_files.pid_alive(0) and not core_files.pid_alive(-1)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_device_file_larger_than_dev_shm_fails_at_creation_naming_it(tmp_path, monkeypatch):
    directory = tmp_path / "shm"
    directory.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=1777", "tmpfs", str(directory)], check=True)
    try:
        monkeypatch.setattr(core_files, "SHM_DIR", str(directory))
        with pytest.raises(SharedMemoryFull, match=r"no room .* 4194304 bytes"):
            shm_files.create(shm_files.new_name("m"), 4 << 20)
        assert os.listdir(directory) == []
    finally:
        subprocess.run(["umount", str(directory)], check=True)
