"""The machine side of the netns harness: ip/tc commands, whether namespaces work here,
processes inside namespaces, and namespaces left behind by dead runs.

Namespace names are ``pydistnet-<pid>-<counter>-h<i>`` (switch: ``-sw<third octets>``, the
third octet of each interface's subnet joined by ``_``), so :func:`cleanup_stale` can tell which
belong to a process that no longer exists and a new Network which subnets are taken. ``ip`` and
``tc`` are looked up on PATH and in the sbin directories; a failing command raises
RuntimeError quoting it and its stderr.
"""
from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from functools import cache

from ._netns_shaping import Shaping

PREFIX = "pydistnet-"
NETNS_DIR = "/var/run/netns"
#: A harness namespace's name: groups (owner pid, counter, switch octets joined by "_", host index).
NAME = re.compile(rf"^{PREFIX}(\d+)-(\d+)-(?:sw(\d+(?:_\d+)*)|h(\d+))$")
_COUNTER = itertools.count()
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin"
#: A tc filter matching every packet, redirected to the device named after it.
MATCH_ALL = "protocol all prio 1 u32 match u32 0 0 action mirred egress redirect dev"


def switch_octets(name: str) -> list[int]:
    """The third octets a switch namespace's name holds ([] for a host's or another name)."""
    match = NAME.match(name)
    return [int(octet) for octet in match.group(3).split("_")] if match and match.group(3) else []


def namespace_stem() -> str:
    """A fresh ``pydistnet-<pid>-<counter>`` prefix for this process's namespaces."""
    return f"{PREFIX}{os.getpid()}-{next(_COUNTER)}"


def _which(tool: str) -> str | None:
    return shutil.which(tool) or shutil.which(tool, path=_SBIN)


def tool_path(tool: str) -> str:
    path = _which(tool)
    if path is None:
        raise FileNotFoundError(f"'{tool}' not found on PATH or in {_SBIN} (Debian: apt-get install iproute2)")
    return path


def run_tool(argv: Sequence[str], batch: list[str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """Run an ip/tc command (``batch``: lines for its ``-batch -``); raise with stderr on failure."""
    argv = [tool_path(argv[0]), *argv[1:], *(["-batch", "-"] if batch is not None else [])]
    text = None if batch is None else "".join(line + "\n" for line in batch)
    result = subprocess.run(argv, input=text, capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}"
                           + (f"\ninput:\n{text}" if text else ""))
    return result


@cache
def netns_available(shaping: bool = False, ipv6: bool = False) -> tuple[bool, str]:
    """(True, "") if this process can make namespaces, veths and a bridge (and, with
    ``shaping``, tbf, clsact + u32 + mirred and TAP devices; with ``ipv6``, the kernel has
    IPv6); else (False, why). Tries it for real, once per process."""
    if not os.path.isdir("/proc/self/ns"):
        return False, "network namespaces need Linux"
    if ipv6 and not os.path.isdir("/proc/sys/net/ipv6"):
        return False, "this kernel has no IPv6 (built without it, or booted with ipv6.disable=1)"
    for tool in ("ip", "tc") if shaping else ("ip",):
        if _which(tool) is None:
            return False, f"'{tool}' not found (Debian: apt-get install iproute2)"
    if os.geteuid() != 0:
        return False, "network namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    name = f"{namespace_stem()}-sw0"
    try:
        run_tool(["ip", "netns", "add", name])
        try:
            run_tool(["ip", "-n", name], ["link set lo up", "link add br0 type bridge",
                                      "link add a0 type veth peer name b0", "link set a0 master br0"])
            if shaping:
                run_tool(["ip", "-n", name, "tuntap", "add", "dev", "t0", "mode", "tap", "vnet_hdr"])
                run_tool(["tc", "-n", name], Shaping(rate=10**6).tbf("a0") + ["qdisc add dev b0 clsact",
                                                                          f"filter add dev b0 ingress {MATCH_ALL} t0"])
        finally:
            run_tool(["ip", "netns", "del", name], check=False)
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        return False, f"cannot set up a network namespace: {error}"
    return True, ""


def require_netns(shaping: bool = False, ipv6: bool = False) -> None:
    """pytest.skip(reason) unless ``netns_available(shaping, ipv6)``."""
    ok, reason = netns_available(shaping, ipv6)
    if not ok:
        import pytest
        pytest.skip(reason)


#: Enters each network namespace given (a file under NETNS_DIR) and enables IPv6 there. Python
#: 3.11 has no os.setns; a process of its own, so that no thread of ours changes namespace.
_ENABLE_IPV6 = r'''
import ctypes, os, sys
setns = ctypes.CDLL(None, use_errno=True).setns
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    if setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        sys.exit(f"setns {path}: {os.strerror(ctypes.get_errno())}")
    os.close(fd)
    for conf in ("all", "default", "lo"):
        with open(f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6", "w") as setting:
            setting.write("0")
'''


def enable_ipv6(namespaces: Sequence[str]) -> None:
    """net.ipv6.conf.{all,default,lo}.disable_ipv6 = 0 inside each namespace (before its
    interfaces are made, so that they inherit it), all by one helper process."""
    if not namespaces:
        return
    if not os.path.isdir("/proc/sys/net/ipv6"):
        raise RuntimeError("ipv6: this kernel has no IPv6 (built without it, or booted with ipv6.disable=1)")
    paths = [os.path.join(NETNS_DIR, name) for name in namespaces]
    result = subprocess.run([sys.executable, "-I", "-c", _ENABLE_IPV6, *paths], capture_output=True, text=True,
                            timeout=30)
    if result.returncode != 0:
        raise RuntimeError(f"enabling IPv6 in the namespaces failed ({result.returncode}): {result.stderr.strip()}")


def netns_inode(name: str) -> int | None:
    try:
        return os.stat(os.path.join(NETNS_DIR, name)).st_ino
    except OSError:
        return None


def pids_in(inodes: set[int]) -> list[int]:
    """Pids of the live processes whose network namespace has one of these inodes."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino in inodes:
                    pids.append(int(entry))
            except OSError:  # gone, or a zombie
                pass
    return pids


def signal_pid(pid: int, sig: int, group: bool = False) -> None:
    try:
        (os.killpg if group else os.kill)(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(procs: Sequence[subprocess.Popen], inodes: set[int], grace: float) -> list[int]:
    """Stop ``procs`` (our children, each leading its process group) and every process inside
    the namespaces ``inodes``: SIGTERM, SIGKILL after ``grace`` s; reap ``procs``. Returns the
    pids still inside the namespaces at the end (none, unless stuck in the kernel)."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for proc in procs:
            if proc.poll() is None:
                signal_pid(proc.pid, sig, group=True)
        for pid in pids_in(inodes):
            signal_pid(pid, sig)
        deadline = time.monotonic() + wait  # real time: processes' exits, the harness's cleanup
        while time.monotonic() < deadline:
            if all(proc.poll() is not None for proc in procs) and not pids_in(inodes):
                return []
            time.sleep(0.01)
    return pids_in(inodes)


def cleanup_stale(grace: float = 0.5) -> list[str]:
    """Delete the harness's namespaces whose owning pid no longer exists (left by a run that
    was killed), after killing the processes still inside them. Returns their names."""
    try:
        names = [name for name in os.listdir(NETNS_DIR) if NAME.match(name)]
    except OSError:
        return []
    stale = [name for name in names
             if (owner := NAME.match(name)) and not os.path.exists(f"/proc/{owner.group(1)}")]
    if stale:
        stop([], {ino for ino in map(netns_inode, stale) if ino is not None}, grace)
        for name in stale:
            run_tool(["ip", "netns", "del", name], check=False)
    return stale
