"""DDP's gradient buckets: how parameters are assigned to them, and what a comm hook sees.

``assign_buckets`` walks the parameters in the order their gradients are expected to be
ready (reverse registration order) and closes a bucket as soon as it holds at least its
cap: the first bucket of each dtype has the small first cap, the rest ``bucket_cap``
(torch's ``_compute_bucket_assignment_by_size``: a parameter larger than the cap gets a
bucket of its own; parameters of different dtypes never share a bucket).

``Bucket`` owns one flat buffer per bucket and a view of it per parameter: gradients are
copied (and pre-divided) into the views, the whole buffer is reduced by one collective.
``SparseBucket`` holds one parameter whose gradient is sparse (``nn.Embedding(sparse=True)``):
the gradient itself, divided in place, is reduced by one sparse all_reduce and stays the
parameter's ``.grad``, as in torch's reducer (sparse gradients never share a bucket).
``GradBucket`` is what a communication hook receives (torch's ``dist.GradBucket`` API).
"""
from __future__ import annotations

import time
from typing import Any

import torch

from ..api.sparse import empty_sparse

DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DEFAULT_BUCKET_CAP_MB = 25


def assign_buckets(params: list[torch.Tensor], order: list[int], first_cap: int, cap: int,
                   sparse: frozenset[int] = frozenset()) -> list[list[int]]:
    """Parameter indices per bucket, buckets in launch order.

    ``order`` lists parameter indices in expected gradient-ready order; each index in
    ``sparse`` (a parameter with sparse gradients) gets a bucket of its own. A bucket closes
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
        if index in sparse:
            buckets.append([index])
            continue
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


class _InFlight:
    """What every bucket tracks per iteration: gradients still to come, the collective in flight."""

    def __init__(self, index: int, param_indices: list[int], params: list[torch.Tensor]):
        self.index = index
        self.param_indices = param_indices
        self.params = params
        self.pending = len(params)
        self.result: Any = None  # a Work or Future while in flight
        self.launched_at = 0.0
        self.done_at: float | None = None

    def reset(self) -> None:
        self.pending = len(self.params)
        self.result = None
        self.done_at = None

    def mark_launched(self, result: Any) -> None:
        """Record the in-flight collective (Work or Future) and stamp its completion time."""
        self.result = result
        callback = getattr(result, "add_done_callback", None)
        if callback is not None:
            callback(self._stamp_done)

    def _stamp_done(self, *_: Any) -> None:
        self.done_at = time.perf_counter()


class Bucket(_InFlight):
    """One bucket's flat buffer, per-parameter views and the state of this iteration."""

    def __init__(self, index: int, param_indices: list[int], params: list[torch.Tensor]):
        super().__init__(index, param_indices, params)
        numel = sum(p.numel() for p in params)
        self.buffer = torch.zeros(numel, dtype=params[0].dtype, device=params[0].device)
        self.views = split_views(self.buffer, params)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def zeros(self) -> torch.Tensor:
        """What a rank that joined reduces in this bucket's place."""
        return torch.zeros_like(self.buffer)

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

    def accept(self, value: torch.Tensor) -> None:
        """Take the reduced bucket (a comm hook may return another tensor than the buffer)."""
        if value is not self.buffer:
            if value.numel() != self.buffer.numel():
                raise ValueError(f"DDP communication hook returned {value.numel()} elements for bucket "
                                 f"{self.index}, which holds {self.buffer.numel()}")
            self.buffer.copy_(value.reshape(-1))

    def write_back(self, used: torch.Tensor | None, as_view: bool) -> None:
        """The averaged gradients into ``.grad`` (or ``.grad`` made the view, with ``as_view``);
        parameters unused on every rank (``used[index]`` 0) are left alone, as torch."""
        for index, param, view in zip(self.param_indices, self.params, self.views):
            if used is not None and not used[index]:
                continue
            grad = param.grad
            if as_view:
                if grad is None or not is_view_of(grad, view):
                    param.grad = view
            elif grad is None:
                param.grad = view.clone()
            else:
                grad.copy_(view)


class SparseBucket(_InFlight):
    """One parameter with a sparse gradient: ``buffer`` is that gradient, reduced in place."""

    views: list[torch.Tensor] = []  # no flat buffer: gradients never become views of it

    def __init__(self, index: int, param_indices: list[int], params: list[torch.Tensor]):
        super().__init__(index, param_indices, params)
        self.buffer = self.zeros()

    @property
    def nbytes(self) -> int:
        grad = self.buffer
        return grad._indices().numel() * 8 + grad._values().numel() * grad.element_size()

    def zeros(self) -> torch.Tensor:
        param = self.params[0]
        return empty_sparse(param.shape, param.dtype, sparse_dim=1)  # an embedding's: a row per index

    def fill(self, position: int, grad: torch.Tensor | None, divisor: float | None, as_view: bool) -> None:
        """The parameter's sparse gradient, divided in place (unless a hook runs); none: no nonzeros."""
        if grad is None:
            self.buffer = self.zeros()
            return
        if grad.layout != torch.sparse_coo:
            raise RuntimeError(f"Expected variable to have sparse gradient (bucket {self.index}), got {grad.layout}")
        if divisor is not None:
            with torch.no_grad():
                grad.div_(divisor)
        self.buffer = grad

    def accept(self, value: torch.Tensor) -> None:
        self.buffer = value

    def write_back(self, used: torch.Tensor | None, as_view: bool) -> None:
        param = self.params[0]
        if used is not None and not used[self.param_indices[0]]:
            return
        if param.grad is None:
            param.grad = self.buffer
        elif param.grad is not self.buffer:
            with torch.no_grad():
                param.grad.copy_(self.buffer)


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
