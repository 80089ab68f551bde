"""Healing ranks from live peers: training state sent from ranks that have it to ranks that do not.

``heal(state, extra, sources, targets)`` is called by every rank of the default group.
``state`` maps names to what training keeps: objects with ``state_dict()`` /
``load_state_dict()`` (torch modules and optimizers, pydist's DistributedSampler), numpy
arrays and torch tensors (filled in place), and nested dicts and lists of those; ``extra``
is a dict of picklable training progress (step, epoch, ...) that the targets' dict takes
over. Every source must hold the same state (as data-parallel ranks do after a step).

How it travels: source 0 sends each target a description (the structure, each tensor's
dtype, shape and offset, the extra dict: pickled, point-to-point); the tensors' bytes are
packed into one buffer, cut into one stripe per source (at most ``stripes``), and every
source sends its stripe to every target at once, so N bytes take about N / (k x link
speed) with k sources on separate links. A target rebuilds the tensors as views of the
buffer and loads them (``load_state_dict``, or a copy into its own array or tensor).
"""
from __future__ import annotations

import pickle
import sys
from typing import Any, NamedTuple

import numpy as np

from .p2p import irecv, isend, recv, send

#: point-to-point tags of healing (negative: pydist's own, never a user's)
DESCRIPTION_TAG, STRIPE_TAG = -(1 << 62), -(1 << 62) + 1
ALIGN = 64  # each tensor's bytes start at a multiple of this in the packed buffer


class _Leaf(NamedTuple):
    """Where one tensor travels: its place among the leaves, kind ("numpy"/"torch"), dtype, shape, byte range."""
    position: int
    kind: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    nbytes: int


class _Ref:
    """Stands for the ``index``-th tensor in a description of the state."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __getstate__(self) -> int:
        return self.index

    def __setstate__(self, index: int) -> None:
        self.index = index


def _is_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _skeleton(obj: Any, leaves: list) -> Any:
    """``obj`` with every array and tensor replaced by a _Ref (it appended to ``leaves``)."""
    if isinstance(obj, np.ndarray) or _is_tensor(obj):
        leaves.append(obj)
        return _Ref(len(leaves) - 1)
    if isinstance(obj, dict):
        return type(obj)((key, _skeleton(value, leaves)) for key, value in obj.items())
    if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
        return type(obj)(_skeleton(value, leaves) for value in obj)
    return obj


def _bytes_of(obj: Any) -> np.ndarray:
    """The bytes of an array or a (CPU) tensor, as a flat uint8 array (a view when it can)."""
    if isinstance(obj, np.ndarray):
        return np.ascontiguousarray(obj).reshape(-1).view(np.uint8)
    return obj.detach().contiguous().reshape(-1).view(__import__("torch").uint8).numpy()


def _describe(state: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """({name: (stateful?, skeleton)}, leaves) of ``state``."""
    leaves: list[Any] = []
    shapes: dict[str, Any] = {}
    for name, obj in state.items():
        stateful = hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")
        shapes[name] = (stateful, _skeleton(obj.state_dict() if stateful else obj, leaves))
    return shapes, leaves


def _layout(leaves: list[Any]) -> tuple[list[_Leaf], int]:
    placed, offset = [], 0
    for index, leaf in enumerate(leaves):
        kind = "numpy" if isinstance(leaf, np.ndarray) else "torch"
        dtype = str(leaf.dtype)
        nbytes = int(leaf.nbytes) if kind == "numpy" else leaf.numel() * leaf.element_size()
        placed.append(_Leaf(index, kind, dtype, tuple(leaf.shape), offset, nbytes))
        offset += (nbytes + ALIGN - 1) // ALIGN * ALIGN
    return placed, offset


def stripes_of(total: int, count: int) -> list[tuple[int, int]]:
    """``count`` near-equal byte ranges covering [0, total) (fewer when it is small)."""
    count = max(1, min(count, total // (1 << 20) or 1))
    cuts = [total * k // count // ALIGN * ALIGN for k in range(count)] + [total]
    return [(cuts[k], cuts[k + 1]) for k in range(count)]


def heal(state: dict[str, Any], extra: dict[str, Any], sources: list[int], targets: list[int],
         stripes: int = 4) -> None:
    """Send ``state`` and ``extra`` from ``sources`` to ``targets`` (global ranks of the default
    group; see the module note); a rank in neither waits for nothing and returns."""
    from .groups import get_rank
    me = get_rank()
    senders = sources[:max(1, stripes)]
    if me in senders:
        shapes, leaves = _describe(state)
        placed, total = _layout(leaves)
        if me == senders[0]:
            description = np.frombuffer(pickle.dumps((shapes, placed, total, extra, senders)), np.uint8)
            for target in targets:
                send(np.array([description.size], np.int64), dst=target, tag=DESCRIPTION_TAG)
                send(description, dst=target, tag=DESCRIPTION_TAG)
        ranges = stripes_of(total, len(senders)) if total else []
        place = senders.index(me)
        start, stop = ranges[place] if place < len(ranges) else (0, 0)  # a small state has fewer stripes
        packed = _pack(leaves, placed, start, stop)
        _wait_all([isend(packed, dst=target, tag=STRIPE_TAG) for target in targets if stop > start])
    elif me in targets:
        _receive(state, extra, sources[0])


def _pack(leaves: list[Any], placed: list[_Leaf], start: int, stop: int) -> np.ndarray:
    """Bytes [start, stop) of the packed buffer (only the leaves that overlap it are copied)."""
    packed = np.zeros(stop - start, np.uint8)
    for leaf in placed:
        lo, hi = max(leaf.start, start), min(leaf.start + leaf.nbytes, stop)
        if lo < hi:
            packed[lo - start:hi - start] = _bytes_of(leaves[leaf.position])[lo - leaf.start:hi - leaf.start]
    return packed


def _receive(state: dict[str, Any], extra: dict[str, Any], first: int) -> None:
    """A target's side: the description from source ``first`` (which names the senders), then
    every stripe at once."""
    size = np.zeros(1, np.int64)
    recv(size, src=first, tag=DESCRIPTION_TAG)
    description = np.empty(int(size[0]), np.uint8)
    recv(description, src=first, tag=DESCRIPTION_TAG)
    shapes, placed, total, their_extra, senders = pickle.loads(description.tobytes())
    flat = np.empty(total, np.uint8)
    ranges = stripes_of(total, len(senders)) if total else []
    _wait_all([irecv(flat[a:b], src=sender, tag=STRIPE_TAG) for sender, (a, b) in zip(senders, ranges) if b > a])
    leaves = [_rebuild(flat, leaf) for leaf in placed]
    for name, (stateful, skeleton) in shapes.items():
        value = _fill(skeleton, leaves)
        if stateful:
            state[name].load_state_dict(value)
        else:
            _assign(state, name, value)
    extra.clear()
    extra.update(their_extra)


def _wait_all(works: list[Any]) -> None:
    for work in works:
        work.wait()  # every rank of the default group is a member: never None


def _rebuild(flat: np.ndarray, leaf: _Leaf) -> Any:
    """A leaf as an array or tensor viewing the received bytes."""
    raw = flat[leaf.start:leaf.start + leaf.nbytes]
    if leaf.kind == "numpy":
        return raw.view(np.dtype(leaf.dtype)).reshape(leaf.shape)
    torch = __import__("torch")
    dtype = getattr(torch, leaf.dtype.removeprefix("torch."))
    return torch.from_numpy(raw).view(dtype).reshape(leaf.shape)


def _fill(skeleton: Any, leaves: list[Any]) -> Any:
    """The skeleton with each _Ref replaced by its tensor."""
    if isinstance(skeleton, _Ref):
        return leaves[skeleton.index]
    if isinstance(skeleton, dict):
        return type(skeleton)((key, _fill(value, leaves)) for key, value in skeleton.items())
    if isinstance(skeleton, (list, tuple)) and type(skeleton) in (list, tuple):
        return type(skeleton)(_fill(value, leaves) for value in skeleton)
    return skeleton


def _assign(state: dict[str, Any], name: str, value: Any) -> None:
    """Put a received value where the target keeps it: into its own array or tensor (in place), else the dict."""
    mine: Any = state.get(name)
    if isinstance(mine, np.ndarray) and isinstance(value, np.ndarray) and mine.shape == value.shape:
        mine[...] = value
    elif _is_tensor(mine) and _is_tensor(value) and mine.shape == value.shape:
        with __import__("torch").no_grad():
            mine.copy_(value)
    else:
        state[name] = value
