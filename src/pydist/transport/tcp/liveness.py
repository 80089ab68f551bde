"""What the kernel says about a silent peer that shares this rank's host.

The heartbeat (see .heartbeat) hears nothing from a stopped process (SIGSTOP), a process
stuck outside Python, a vanished host, and also from a live process on a machine so loaded
that its I/O thread did not run for the whole timeout (256 ranks on 2 cores). For a peer in
the same kernel, pid namespace and network namespace (no network between them to lose),
/proc tells these apart: each rank publishes ``process_identity()`` in its record, and
``verdict(identity)`` reads the peer's /proc entry: "gone" (exited, or its pid reused),
"stopped" (SIGSTOP, a debugger), "alive" (running, waiting for a CPU, sleeping, in I/O), or
None where /proc says nothing (another host or namespace: the heartbeat alone decides).
A live process stuck in C code is "alive" here: on its own host it is found at the
operation's timeout, as NCCL's watchdog finds it.
"""
from __future__ import annotations

import os

#: /proc/<pid>/stat states of a process that will not run until someone resumes it
STOPPED = {"T", "t"}
#: states of a process that is gone or going
GONE = {"Z", "X", "x"}


def _namespace(kind: str) -> str:
    return str(os.stat(f"/proc/self/ns/{kind}").st_ino)


def _stat(pid: int | str) -> tuple[str, str]:
    """(state, start time in clock ticks since boot) of a process, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return fields[0], fields[19]


def process_identity() -> str:
    """``boot id:pid namespace:net namespace:pid:start time``, or "" without /proc."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            boot_id = boot.read().strip()
        return ":".join([boot_id, _namespace("pid"), _namespace("net"), str(os.getpid()), _stat("self")[1]])
    except (OSError, IndexError):
        return ""


def verdict(identity: str, mine: str | None = None) -> str | None:
    """"gone", "stopped" or "alive" for the process ``identity`` names (see the module note);
    None when it is not in this rank's kernel, pid and network namespaces (``mine``:
    this process's identity, read when not given)."""
    mine = process_identity() if mine is None else mine
    if not identity or not mine or identity.split(":")[:3] != mine.split(":")[:3]:
        return None
    pid, started = identity.split(":")[3:5]
    try:
        state, start = _stat(pid)
    except (OSError, IndexError):
        return "gone"
    if start != started or state in GONE:
        return "gone"
    return "stopped" if state in STOPPED else "alive"
