"""Debugging a distributed job: flight recorder, trace analyzer, timeline.

- Flight recorder (always on, ``recorder``): the last ``PYDIST_TRACE_BUFFER`` (default 2000)
  operations of every group; written to ``PYDIST_TRACE_DIR/pydist_trace_rank{R}.json`` when an
  operation fails (timeout, dead peer, aborted group, desync) and when the rank destroys its
  process group; ``dump_traces()`` writes them on demand. ``PYDIST_DEBUG=detail`` adds call sites.
- ``python -m pydist.debug DIR`` reads every rank's file and names the ranks that are behind,
  the ranks whose calls differ at the same sequence number, and the failed operations
  (``analyze``).
- Timeline (``PYDIST_TIMELINE=path``): every operation of every rank as Chrome/Perfetto
  trace events (``timeline``).
"""
from __future__ import annotations

from ..core.settings import settings
from . import _registry


def dump_traces(directory: str | None = None, rank: int | None = None) -> list[str]:
    """Write the flight recorder of every rank of this process (or only ``rank``) to
    ``directory`` (default: PYDIST_TRACE_DIR); the paths written."""
    directory = directory or settings().trace_dir
    if not directory:
        raise ValueError("dump_traces: no directory: pass one or set PYDIST_TRACE_DIR")
    return [_registry.write(session, directory, "on demand") for session in _registry.sessions(rank)]


def traces(rank: int | None = None) -> list[dict]:
    """What ``dump_traces`` would write, one dict per rank of this process (see the file format
    in ``pydist.debug._registry.snapshot``)."""
    return [_registry.snapshot(session) for session in _registry.sessions(rank)]


__all__ = ["dump_traces", "traces"]
