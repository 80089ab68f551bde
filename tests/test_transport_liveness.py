"""transport/tcp/liveness.py: what /proc says about a silent peer on this rank's host."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from pydist.transport.tcp.liveness import process_identity, verdict

pytestmark = pytest.mark.skipif(not process_identity(), reason="needs Linux /proc")


def _child() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _identity_of(pid: int) -> str:
    mine = process_identity().split(":")
    with open(f"/proc/{pid}/stat") as stat:
        started = stat.read().rsplit(")", 1)[1].split()[19]
    return ":".join(mine[:3] + [str(pid), started])


def _becomes(identity: str, state: str) -> bool:
    """The verdict reaches ``state`` within 10 s (a signal takes effect at the child's next schedule)."""
    until = time.monotonic() + 10.0
    while verdict(identity) != state and time.monotonic() < until:
        time.sleep(0.01)
    return verdict(identity) == state


def test_a_running_process_is_alive_a_stopped_one_stopped_an_ended_one_gone():
    child = _child()
    try:
        identity = _identity_of(child.pid)
        assert verdict(process_identity()) == "alive"
        assert verdict(identity) == "alive"
        child.send_signal(signal.SIGSTOP)
        assert _becomes(identity, "stopped")
        child.send_signal(signal.SIGCONT)
        child.kill()
        child.wait()
        assert verdict(identity) == "gone"
    finally:
        child.kill()
        child.wait()


def test_a_reused_pid_is_gone_and_another_namespace_is_none():
    boot, pid_ns, net_ns, pid, started = process_identity().split(":")
    assert verdict(":".join([boot, pid_ns, net_ns, pid, str(int(started) + 1)])) == "gone"  # another process
    assert verdict(":".join([boot, pid_ns, "1", pid, started])) is None  # another network namespace: a host
    assert verdict(":".join(["other-boot", pid_ns, net_ns, pid, started])) is None  # another machine
    assert verdict("") is None  # a peer that published nothing (another platform)
