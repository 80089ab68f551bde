"""What a process holds right now, read from /proc (Linux): resident memory, descriptors, sockets."""
from __future__ import annotations

import os


def rss_mib(status: str = "/proc/self/status") -> float:
    """Resident set size (VmRSS) in MiB; 0.0 where /proc does not say."""
    with open(status) as lines:
        for line in lines:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024  # kB
    return 0.0


def descriptors(fd_dir: str = "/proc/self/fd") -> tuple[int, int]:
    """(open descriptors, of which sockets); the one used to list them is not counted
    (it is closed by the time it is looked at)."""
    fds = sockets = 0
    for name in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, name))
        except OSError:
            continue
        fds += 1
        sockets += target.startswith("socket:")
    return fds, sockets


def usage() -> dict[str, float]:
    """``rss_mib``, ``fds`` and ``sockets`` of this process now."""
    fds, sockets = descriptors()
    return {"rss_mib": round(rss_mib(), 2), "fds": fds, "sockets": sockets}
