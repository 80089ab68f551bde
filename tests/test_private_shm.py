"""make test's pytest-xdist workers each see a /dev/shm of their own (tests/private_shm.py):
what a worker's jobs make there is not in the machine's /dev/shm, where the other worker's
jobs would count it or clean it up."""
import os

import pytest


def test_a_worker_s_dev_shm_is_its_own(tmp_path):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("not a pytest-xdist worker: this process uses the machine's /dev/shm")
    controller = os.getppid()  # pytest-xdist's controller, which keeps the machine's /dev/shm
    assert os.readlink("/proc/self/ns/mnt") != os.readlink(f"/proc/{controller}/ns/mnt")
    machine_shm = f"/proc/{controller}/root/dev/shm"
    name = f"pydist-test-private-{os.getpid()}"
    with open(os.path.join("/dev/shm", name), "wb"):
        pass
    try:
        assert os.stat("/dev/shm").st_dev != os.stat(machine_shm).st_dev
        assert not os.path.exists(os.path.join(machine_shm, name))
    finally:
        os.unlink(os.path.join("/dev/shm", name))
