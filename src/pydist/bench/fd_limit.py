"""Enough file descriptors for N ranks: RLIMIT_NOFILE checked, and raised when it can be."""
from __future__ import annotations

import resource

#: Descriptors a rank holds beside its peers' (interpreter, pipes, listeners, threads' wakeups).
BASE_FDS = 64


def fds_needed(nproc: int) -> int:
    """Descriptors the busiest rank may hold: rank 0 serves the store (a connection or two per
    rank) and has a socket to every peer, so about three per rank beside its own."""
    return BASE_FDS + 3 * nproc


class LimitTooLow(RuntimeError):
    """RLIMIT_NOFILE's hard limit is below what the ranks need; the message says both numbers."""


def ensure_fds(nproc: int) -> int:
    """Make this process's soft RLIMIT_NOFILE (inherited by the ranks it starts) at least
    :func:`fds_needed`, up to the hard limit; the soft limit now. Raises LimitTooLow when
    the hard limit is lower."""
    needed = fds_needed(nproc)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return soft
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise LimitTooLow(f"{nproc} ranks need up to {needed} open file descriptors per process, but "
                          f"RLIMIT_NOFILE (ulimit -n) allows {soft} and its hard limit is {hard}: raise the hard "
                          f"limit (ulimit -Hn {needed} as root, or limits.conf) or run fewer ranks")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return needed
