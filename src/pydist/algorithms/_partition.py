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


def row_split(shape: tuple[int, ...], count: int, sizes: list[int] | None, parts: int,
              name: str) -> list[tuple[int, int]]:
    """The element ranges of a tensor of ``shape`` (``count`` elements) split along dim 0 by
    ``sizes`` (rows; None or empty: evenly), as all_to_all_single splits; ValueError naming
    ``name`` for sizes that do not fit."""
    rows = shape[0] if shape else 1
    row = count // rows if rows else 0
    if not sizes:
        if rows % parts:
            raise ValueError(f"{name}: dim 0 ({rows}) must divide by the group size ({parts}) "
                             "when no split sizes are given")
        sizes = [rows // parts] * parts
    sizes = [int(s) for s in sizes]
    if len(sizes) != parts or any(s < 0 for s in sizes) or sum(sizes) != rows:
        raise ValueError(f"{name} split sizes {sizes}: expected {parts} non-negative sizes summing to "
                         f"dim 0 ({rows})")
    ranges, start = [], 0
    for size in sizes:
        ranges.append((start * row, (start + size) * row))
        start += size
    return ranges


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


def end_to_end(parts: list[np.ndarray]) -> np.ndarray | None:
    """One 1-D array over ``parts`` when they lie end to end in memory, in this order, with
    one dtype (views of one tensor, as all_gather_into_tensor's blocks): writing to it writes
    exactly their elements. None otherwise."""
    if not parts or any(part.dtype != parts[0].dtype or not part.flags.c_contiguous for part in parts):
        return None
    filled = [part for part in parts if part.nbytes]  # an empty view's address means nothing
    if not filled:
        return parts[0].reshape(-1)
    start = at = filled[0].ctypes.data
    for part in filled:
        if part.ctypes.data != at:
            return None
        at += part.nbytes
    first = filled[0].reshape(-1)
    return np.lib.stride_tricks.as_strided(first, shape=((at - start) // first.itemsize,),
                                           strides=(first.itemsize,))


def packed_by_host(hosts: list[list[int]], sizes: list[int], packed: np.ndarray
                   ) -> tuple[dict[int, np.ndarray], list[np.ndarray]]:
    """Views of ``packed``, which holds every rank's part (``sizes[g]`` elements for group rank
    g) host after host in ``hosts`` order: per group rank, and per host (its ranks' parts)."""
    parts, host_blocks, at = {}, [], 0
    for ranks in hosts:
        start = at
        for g in ranks:
            parts[g] = packed[at:at + sizes[g]]
            at += sizes[g]
        host_blocks.append(packed[start:at])
    return parts, host_blocks


#: the Comm.scratch index of hierarchical algorithms' packed buffers (the network algorithms
#: they call use the low indices)
PACKED_SCRATCH = 16
