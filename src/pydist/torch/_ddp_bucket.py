"""DDP's gradient buckets: how parameters are assigned to them, and what a comm hook sees.

``assign_buckets`` walks the parameters in the order their gradients are expected to be
ready (reverse registration order) and closes a bucket as soon as it holds at least its
cap: the first bucket of each dtype has the small first cap, the rest ``bucket_cap``
(torch's ``_compute_bucket_assignment_by_size``: a parameter larger than the cap gets a
bucket of its own; parameters of different dtypes never share a bucket).

``Bucket`` owns one flat buffer per bucket and a view of it per parameter: gradients are
copied (and pre-divided) into the views, the whole buffer is reduced by one collective.
``GradBucket`` is what a communication hook receives (torch's ``dist.GradBucket`` API).
"""
from __future__ import annotations

import time
from typing import Any

import torch

DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DEFAULT_BUCKET_CAP_MB = 25


def assign_buckets(params: list[torch.Tensor], order: list[int], first_cap: int, cap: int) -> list[list[int]]:
    """Parameter indices per bucket, buckets in launch order.

    ``order`` lists parameter indices in expected gradient-ready order. A bucket closes
    once its bytes reach its cap (``first_cap`` for a dtype's first bucket, then ``cap``);
    open buckets are closed at the end. Buckets are ordered by their first parameter's
    position in ``order``, so they become ready one after another.
    """
    position = {index: pos for pos, index in enumerate(order)}
    open_buckets: dict[torch.dtype, list[int]] = {}
    open_bytes: dict[torch.dtype, int] = {}
    closed_any: set[torch.dtype] = set()
    buckets: list[list[int]] = []
    for index in order:
        param = params[index]
        key = param.dtype
        open_buckets.setdefault(key, []).append(index)
        open_bytes[key] = open_bytes.get(key, 0) + param.numel() * param.element_size()
        if open_bytes[key] >= (cap if key in closed_any else first_cap):
            buckets.append(open_buckets.pop(key))
            open_bytes[key] = 0
            closed_any.add(key)
    buckets.extend(bucket for bucket in open_buckets.values() if bucket)
    buckets.sort(key=lambda bucket: position[bucket[0]])
    return buckets


class Bucket:
    """One bucket's flat buffer, per-parameter views and the state of this iteration."""

    def __init__(self, index: int, param_indices: list[int], params: list[torch.Tensor]):
        self.index = index
        self.param_indices = param_indices
        self.params = params
        numel = sum(p.numel() for p in params)
        self.buffer = torch.zeros(numel, dtype=params[0].dtype)
        self.views = split_views(self.buffer, params)
        self.pending = len(params)
        self.result: Any = None  # a Work or Future while in flight
        self.launched_at = 0.0
        self.done_at: float | None = None

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def reset(self) -> None:
        self.pending = len(self.params)
        self.result = None
        self.done_at = None

    def fill(self, position: int, grad: torch.Tensor | None, divisor: float | None, as_view: bool) -> None:
        """Put parameter ``position``'s gradient into its view (divided, unless a hook runs).

        A gradient that already is the view (gradient_as_bucket_view) is divided in place;
        a missing gradient contributes zeros. With ``as_view`` the parameter's ``.grad``
        becomes the view, so later iterations accumulate straight into the bucket.
        """
        view = self.views[position]
        if grad is None:
            view.zero_()
        elif is_view_of(grad, view):
            if divisor is not None:
                view.div_(divisor)
        else:
            if divisor is not None:
                torch.div(grad, divisor, out=view)
            else:
                view.copy_(grad)
            if as_view:
                self.params[position].grad = view

    def mark_launched(self, result: Any) -> None:
        """Record the in-flight collective (Work or Future) and stamp its completion time."""
        self.result = result
        callback = getattr(result, "add_done_callback", None)
        if callback is not None:
            callback(self._stamp_done)

    def _stamp_done(self, *_: Any) -> None:
        self.done_at = time.perf_counter()


def split_views(buffer: torch.Tensor, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Consecutive views of the flat ``buffer``, one per parameter, shaped like it."""
    views, offset = [], 0
    for param in params:
        views.append(buffer[offset:offset + param.numel()].view(param.shape))
        offset += param.numel()
    return views


def is_view_of(grad: torch.Tensor, view: torch.Tensor) -> bool:
    """True when ``grad`` is exactly ``view`` (same memory, shape and strides)."""
    return (grad.data_ptr() == view.data_ptr() and grad.shape == view.shape and grad.stride() == view.stride()
            and grad.dtype == view.dtype)


class GradBucket:
    """torch's ``dist.GradBucket``: what a communication hook gets for one bucket.

    ``buffer()`` is the flat gradient tensor (not pre-divided by the world size),
    ``gradients()`` views of it shaped like ``parameters()``, ``index()`` the bucket's
    position in launch order, ``is_last()`` whether it is the last bucket, ``set_buffer(t)``
    replaces what ``buffer()`` returns for this call (compression wrappers use it).
    """

    def __init__(self, index: int, buffer: torch.Tensor, parameters: list[torch.Tensor], is_last: bool):
        self._index = index
        self._original = buffer
        self._buffer = buffer
        self._parameters = parameters
        self._is_last = is_last

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def set_buffer(self, buffer: torch.Tensor) -> None:
        self._buffer = buffer

    def gradients(self) -> list[torch.Tensor]:
        return split_views(self._original, self._parameters)

    def parameters(self) -> list[torch.Tensor]:
        return list(self._parameters)

    def is_last(self) -> bool:
        return self._is_last

    def __repr__(self) -> str:
        return f"<GradBucket index={self._index} numel={self._buffer.numel()} dtype={self._buffer.dtype}>"
