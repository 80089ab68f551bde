"""How much memory this process may use: the bound on what peers can make it hold.

A message that arrives before its receive is posted is held in memory (see matching); no
message larger than this process may hold can be legitimate, so the bytes held for one
peer's messages are bounded by ``memory_limit()``: the machine's physical memory, lowered
by this process's address-space and data limits (``ulimit -v``, ``ulimit -d``) and by its
container's memory limit (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``) where set.
"""
from __future__ import annotations

import functools
import os
import resource

#: where a container's own memory limit is seen (cgroup v2, then v1)
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


@functools.cache
def memory_limit() -> int:
    """The bytes this process may use at most (read once; see the module note)."""
    limits = [os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")]
    for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
        soft, _ = resource.getrlimit(which)
        if soft != resource.RLIM_INFINITY:
            limits.append(soft)
    for path in CGROUP_LIMITS:
        try:
            with open(path) as limit:
                text = limit.read().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (v2) or a huge number (v1) when there is no limit
            limits.append(int(text))
    return min(limits)
