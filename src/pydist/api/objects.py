"""Collectives of picklable Python objects, as torch's ``*_object`` functions.

Objects are pickled to bytes; sizes travel first (int64), then the bytes, through the
same algorithms as tensors (uneven parts are fine). Unpickling runs arbitrary code: only
use these with peers you trust, as torch warns.
"""
from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np

from ..core.opspec import describe
from . import collectives as coll
from . import p2p
from .groups import member_group


def _dumps(obj: Any) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy()


def _loads(data: np.ndarray) -> Any:
    return pickle.load(io.BytesIO(data.tobytes()))


def _split(data: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [data[offsets[i]:offsets[i + 1]] for i in range(len(sizes))]


def all_gather_object(object_list: list, obj: Any, group: Any = None) -> None:
    """``object_list[i]`` = rank i's ``obj``, on every rank."""
    target = member_group(group, "all_gather_object")
    if target is None:
        return
    n = target.size()
    if not isinstance(object_list, list) or len(object_list) != n:
        raise ValueError(f"object_list: expected a list of {n} slots (the group size)")
    mine = _dumps(obj)
    sizes = np.zeros(n, np.int64)
    coll.all_gather_into_tensor(sizes, np.array([mine.size], np.int64), group=target)
    parts = [np.empty(int(s), np.uint8) for s in sizes]
    coll.all_gather(parts, mine, group=target)
    object_list[:] = [_loads(part) for part in parts]


def gather_object(obj: Any, object_gather_list: list | None = None, dst: int | None = None, group: Any = None,
                  group_dst: int | None = None) -> None:
    """``object_gather_list[i]`` on ``dst`` = rank i's ``obj``."""
    target = member_group(group, "gather_object")
    if target is None:
        return
    root = coll.root_rank(target, dst, group_dst, "dst")
    n, is_root = target.size(), target.rank() == root
    if is_root and (not isinstance(object_gather_list, list) or len(object_gather_list) != n):
        raise ValueError(f"object_gather_list: expected a list of {n} slots on the destination rank")
    mine = _dumps(obj)
    sizes = np.zeros(n, np.int64)
    coll.gather(np.array([mine.size], np.int64), list(sizes.reshape(n, 1)) if is_root else None,
                group=target, group_dst=root)
    parts = [np.empty(int(s), np.uint8) for s in sizes] if is_root else None
    target.run(describe("gather_object", "gather", mine, root=root), target.engine.gather, (mine, parts, root), [],
               False)
    if is_root:
        assert object_gather_list is not None and parts is not None  # the root's (checked above)
        object_gather_list[:] = [_loads(part) for part in parts]


def broadcast_object_list(object_list: list, src: int | None = None, group: Any = None, device: Any = None,
                          group_src: int | None = None) -> None:
    """Replace ``object_list`` on every rank by ``src``'s (same length everywhere)."""
    target = member_group(group, "broadcast_object_list")
    if target is None:
        return
    root = coll.root_rank(target, src, group_src, "src")
    if not isinstance(object_list, list):
        raise TypeError(f"object_list: expected a list, got {type(object_list).__name__}")
    is_root = target.rank() == root
    payloads = [_dumps(o) for o in object_list] if is_root else []
    sizes = np.array([p.size for p in payloads] if is_root else [0] * len(object_list), np.int64)
    coll.broadcast(sizes, group=target, group_src=root)
    data = np.concatenate(payloads) if is_root and payloads else np.empty(int(sizes.sum()), np.uint8)
    coll.broadcast(data, group=target, group_src=root)
    if not is_root:
        object_list[:] = [_loads(part) for part in _split(data, sizes)]


def scatter_object_list(scatter_object_output_list: list, scatter_object_input_list: list | None = None,
                        src: int | None = None, group: Any = None, group_src: int | None = None) -> None:
    """``scatter_object_output_list[0]`` on rank i = ``scatter_object_input_list[i]`` of ``src``."""
    target = member_group(group, "scatter_object_list")
    if target is None:
        return
    root = coll.root_rank(target, src, group_src, "src")
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError("scatter_object_output_list: expected a list with at least one slot")
    n, is_root = target.size(), target.rank() == root
    if is_root and (not isinstance(scatter_object_input_list, list) or len(scatter_object_input_list) != n):
        raise ValueError(f"scatter_object_input_list: expected {n} objects (the group size) on the source rank")
    payloads: list[np.ndarray] | None = None
    sizes: list[np.ndarray] | None = None
    if is_root:
        assert scatter_object_input_list is not None  # checked above
        payloads = [_dumps(o) for o in scatter_object_input_list]
        sizes = [np.array([p.size], np.int64) for p in payloads]
    size = np.zeros(1, np.int64)
    coll.scatter(size, sizes, group=target, group_src=root)
    data = np.empty(int(size[0]), np.uint8)
    target.run(describe("scatter_object_list", "scatter", data, root=root), target.engine.scatter,
               (data, payloads, root), [], False)
    scatter_object_output_list[0] = _loads(data)


def send_object_list(object_list: list, dst: int | None = None, group: Any = None, device: Any = None,
                     group_dst: int | None = None, use_batch: bool = False) -> None:
    """Send a list of objects to ``dst`` (which calls recv_object_list with a list as long)."""
    if member_group(group, "send_object_list") is None:
        return
    payloads = [_dumps(o) for o in object_list]
    p2p.send(np.array([p.size for p in payloads], np.int64), dst, group, group_dst=group_dst)
    p2p.send(np.concatenate(payloads) if payloads else np.empty(0, np.uint8), dst, group, group_dst=group_dst)


def recv_object_list(object_list: list, src: int | None = None, group: Any = None, device: Any = None,
                     group_src: int | None = None, use_batch: bool = False) -> int:
    """Fill ``object_list`` with objects sent by ``src`` (None: any rank); returns the sender."""
    if member_group(group, "recv_object_list") is None:
        return -1
    sizes = np.zeros(len(object_list), np.int64)
    sender = p2p.recv(sizes, src, group, group_src=group_src)
    data = np.empty(int(sizes.sum()), np.uint8)
    p2p.recv(data, sender, group)
    object_list[:] = [_loads(part) for part in _split(data, sizes)]
    return sender
