"""Splitting buffers into per-rank blocks and pipeline segments."""
from __future__ import annotations

import numpy as np


def block_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering ``count`` elements; the first ones one longer."""
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for index in range(parts):
        stop = start + base + (index < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def blocks(array: np.ndarray, parts: int) -> list[np.ndarray]:
    """``array`` as ``parts`` views (see block_bounds)."""
    return [array[start:stop] for start, stop in block_bounds(array.size, parts)]


def segments(length: int, itemsize: int, segment_bytes: int) -> list[slice]:
    """Slices of at most ``segment_bytes`` covering ``length`` elements (one empty slice for 0)."""
    per = max(1, segment_bytes // max(itemsize, 1))
    if length == 0:
        return [slice(0, 0)]
    return [slice(start, min(start + per, length)) for start in range(0, length, per)]


def tag(step: int, segment: int) -> int:
    """A message tag unique per (step, segment) within one operation."""
    return (step << 24) | segment


def chunks(count: int, per: int) -> list[tuple[int, int]] | tuple[tuple[int, int]]:
    """[start, stop) ranges of at most ``per`` covering ``count`` (one empty range for 0)."""
    if count <= per:
        return ((0, count),)
    return [(start, min(start + per, count)) for start in range(0, count, max(per, 1))]
