"""Same-host barrier: one arena phase (publish a counter, wait for everyone's).

The engine picks it for every barrier of a group of several ranks that all share this
host's memory.
"""
from __future__ import annotations

from .comm import Comm


def barrier(comm: Comm) -> None:
    """Return once every rank of the group has called barrier."""
    comm.arena.sync(comm, comm.call)
