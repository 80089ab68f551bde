"""DDP's reducer: gradients into buckets, one async all_reduce per bucket, results back.

Life of a synced iteration (torch's c10d Reducer, in Python):

1. After a forward with grad enabled outside no_sync, ``prepare_for_backward(outputs)``
   resets the buckets and, with find_unused_parameters, walks the autograd graph from the
   outputs: parameters it does not reach are "unused".
2. In backward, each parameter's post-accumulate-grad hook (``on_grad_ready``) copies its
   gradient into its bucket's view, divided by the world size (no division when a comm
   hook runs: hooks divide themselves). The first hook of the backward queues
   ``finalize_backward`` with the autograd engine and marks the unused parameters ready
   (zeros, or what no_sync accumulated). A bucket whose last gradient arrives is launched
   as ONE async all_reduce (or comm hook) at once, so communication overlaps the rest of
   backward; launches happen in bucket-index order on every rank (a bucket ready early
   waits for its predecessors), which keeps the collectives matched across ranks.
3. ``finalize_backward`` runs when backward ends: it waits for every bucket, copies the
   averaged buffers into ``param.grad`` (or leaves them there: gradient_as_bucket_view
   makes ``param.grad`` a view of the bucket, so autograd accumulates in place and no copy
   is made), and with find_unused_parameters skips parameters unused on every rank (their
   used-flags are all_reduced after the last bucket).

A parameter with a sparse gradient (a SparseBucket of its own) is divided in place and
reduced by a sparse all_reduce; its ``.grad`` stays sparse (a rank without one reduces an
empty sparse tensor, and takes the sum).

If a parameter got no gradient and find_unused_parameters is off, the buckets never
complete; the next forward raises torch's "Expected to have finished reduction in the
prior iteration ..." error, naming the parameters.
"""
from __future__ import annotations

import concurrent.futures
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.autograd import Variable

import pydist as dist

from ._ddp_bucket import Bucket, GradBucket, SparseBucket
from ._ddp_sync import reachable_parameters

UNUSED_PARAMETERS = (
    "Expected to have finished reduction in the prior iteration before starting a new one. This error indicates "
    "that your module has parameters that were not used in producing loss. You can enable unused parameter "
    "detection by passing the keyword argument `find_unused_parameters=True` to `DistributedDataParallel`, and by \n"
    "making sure all `forward` function outputs participate in calculating loss. \n"
    "If you already have done the above, then the distributed data parallel module wasn't able to locate the "
    "output tensors in the return value of your module's `forward` function. Please include the loss function and "
    "the structure of the return value of `forward` of your module when reporting this issue (e.g. list, dict, "
    "iterable).\n"
    "Parameter indices which did not receive grad for rank {rank}: {indices}\n"
    "Parameters which did not receive grad for rank {rank}: {names}")

MARKED_TWICE = (
    "Expected to mark a variable ready only once. This error is caused by one of the following reasons: 1) Use of "
    "a module parameter outside the `forward` function. Please make sure model parameters are not shared across "
    "multiple concurrent forward-backward passes. 2) Reused parameters in multiple reentrant backward passes. For "
    "example, if you use multiple `checkpoint` functions to wrap the same part of your model, it would result in "
    "the same set of parameters been used by different reentrant backward passes multiple times. Parameter at "
    "index {index} with name {name} has been marked as ready twice.")


def _grad_hook(reducer: weakref.ref[Reducer], index: int) -> Callable[[torch.Tensor], None]:
    def hook(_param: torch.Tensor) -> None:
        target = reducer()
        if target is not None:
            target.on_grad_ready(index)
    return hook


def wait_value(result: Any) -> torch.Tensor:
    """The tensor a bucket's collective produced: a pydist Work, a torch or concurrent Future."""
    if isinstance(result, torch._C.Future):  # torch.futures.Future and what its then() returns
        value = result.wait()
    elif isinstance(result, concurrent.futures.Future):
        value = result.result()
    elif hasattr(result, "wait") and hasattr(result, "result"):
        result.wait()
        value = result.result()
    else:
        raise TypeError("a DDP communication hook must return a torch.futures.Future (or a pydist Work), "
                        f"got {type(result).__name__}")
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if not isinstance(value, torch.Tensor):
        raise TypeError("a DDP communication hook's Future must hold a single tensor (the reduced bucket), "
                        f"got {type(value).__name__}")
    return value


def _busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end] intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


class Reducer:
    """Buckets, autograd hooks and the per-iteration state of DDP's gradient averaging."""

    def __init__(self, params: list[torch.Tensor], names: list[str], group: Any, bucket_indices: list[list[int]],
                 find_unused: bool, as_view: bool, sparse: frozenset[int] = frozenset()):
        """``sparse``: indices of the parameters whose gradients are sparse (each alone in its bucket)."""
        self.params = params
        self.names = names
        self.group = group
        self.find_unused = find_unused
        self.as_view = as_view
        self.buckets = [(SparseBucket if indices[0] in sparse else Bucket)(i, indices, [params[j] for j in indices])
                        for i, indices in enumerate(bucket_indices)]
        self.location = {index: (bucket, position) for bucket in self.buckets
                         for position, index in enumerate(bucket.param_indices)}
        self.comm_hook: Callable | None = None
        self.comm_state: Any = None
        self.expect_hooks = False  # a synced backward may come (set by a synced forward)
        self.require_finalize = False  # a synced backward started and has not been finalized
        self.started = False
        self.ready = [False] * len(params)
        self.next_bucket = 0
        self.unused: list[int] = []
        self.local_used = torch.zeros(len(params), dtype=torch.int32)
        self.used_flags: torch.Tensor | None = None
        self.used_work: Any = None
        self.divisor = float(group.size())
        self.divisor_source: tuple[Any, torch.Tensor] | None = None
        self.stats = {"bytes_reduced": 0, "seconds_communicating": 0.0, "allreduces": 0}
        ref = weakref.ref(self)
        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(_grad_hook(ref, i))

    # -- forward side ---------------------------------------------------------------------
    def ensure_prior_reduction_finished(self) -> None:
        """Raise torch's unused-parameter error if the last synced backward never completed."""
        if not self.require_finalize:
            return
        missing = [i for i, ready in enumerate(self.ready) if not ready]
        raise RuntimeError(UNUSED_PARAMETERS.format(rank=self.group.rank(), indices=" ".join(map(str, missing)),
                                                    names=", ".join(self.names[i] for i in missing)))

    def prepare_for_backward(self, outputs: list[torch.Tensor]) -> None:
        """Expect a synced backward; with find_unused_parameters, find what ``outputs`` do not reach."""
        self.expect_hooks, self.started, self.next_bucket = True, False, 0
        self.ready = [False] * len(self.params)
        self.used_flags = self.used_work = None
        for bucket in self.buckets:
            bucket.reset()
        if self.find_unused:
            reached = reachable_parameters(outputs)
            self.unused = [i for i, p in enumerate(self.params) if id(p) not in reached]

    def set_divisor_source(self, work: Any, count: torch.Tensor, divide_by_initial_world_size: bool) -> None:
        """join(): gradients divide by the number of ranks still training, once ``work`` gives it."""
        self.divisor = float(self.group.size())
        self.divisor_source = None if divide_by_initial_world_size else (work, count)

    def _divisor(self) -> float:
        if self.divisor_source is not None:
            work, count = self.divisor_source
            self.divisor_source = None
            work.wait()
            self.divisor = max(1.0, float(count.item()))
        return self.divisor

    # -- backward side --------------------------------------------------------------------
    def on_grad_ready(self, index: int) -> None:
        """Autograd hook: ``params[index].grad`` is final for this backward."""
        if self.find_unused:
            self.local_used[index] = 1  # accumulates over no_sync iterations, as torch's local_used_map
        if not self.expect_hooks:
            return
        if not self.started:
            self.started = self.require_finalize = True
            Variable._execution_engine.queue_callback(self.finalize_backward)
            if self.as_view and not self.find_unused:
                self._point_grads_at_buckets()
            for unused in self.unused:
                self._mark_ready(unused)
        self._mark_ready(index)

    def _point_grads_at_buckets(self) -> None:
        """Let autograd accumulate the gradients still to come straight into the buckets."""
        for bucket in self.buckets:
            for param, view in zip(bucket.params, bucket.views):
                if param.grad is None:
                    view.zero_()
                    param.grad = view

    def _mark_ready(self, index: int) -> None:
        if self.ready[index]:
            raise RuntimeError(MARKED_TWICE.format(index=index, name=self.names[index]))
        self.ready[index] = True
        bucket, position = self.location[index]
        divisor = self._divisor() if self.comm_hook is None else None
        bucket.fill(position, self.params[index].grad, divisor, self.as_view)
        bucket.pending -= 1
        if bucket.pending == 0:
            self._launch_ready()

    def _launch_ready(self) -> None:
        while self.next_bucket < len(self.buckets) and self.buckets[self.next_bucket].pending == 0:
            self.launch(self.buckets[self.next_bucket])
            self.next_bucket += 1
        if self.next_bucket == len(self.buckets) and self.find_unused and self.used_work is None:
            self.used_flags = self.local_used.clone()
            self.used_work = dist.all_reduce(self.used_flags, op=dist.ReduceOp.MAX, group=self.group, async_op=True)

    def launch(self, bucket: Bucket | SparseBucket) -> None:
        """Start reducing ``bucket``: one async all_reduce (SUM of pre-divided values) or the comm hook."""
        bucket.launched_at = time.perf_counter()
        bucket.mark_launched(self._reduce(bucket.index, bucket.buffer, bucket.params))
        self.stats["bytes_reduced"] += bucket.nbytes
        self.stats["allreduces"] += 1

    def _reduce(self, index: int, buffer: torch.Tensor, params: list[torch.Tensor]) -> Any:
        if self.comm_hook is None:
            return dist.all_reduce(buffer, group=self.group, async_op=True)
        return self.comm_hook(self.comm_state, GradBucket(index, buffer, params, index == len(self.buckets) - 1))

    def finalize_backward(self) -> None:
        """End of backward (autograd callback): wait for every bucket, write the averages back."""
        missing = [i for i, ready in enumerate(self.ready) if not ready]
        if missing and not self.find_unused:
            return  # buckets incomplete: the next forward raises, naming the parameters
        try:
            for index in missing:  # reached by the graph but got no gradient (an output not in the loss)
                self._mark_ready(index)
            for bucket in self.buckets:
                bucket.accept(wait_value(bucket.result))
            if self.used_work is not None:
                self.used_work.wait()
            for bucket in self.buckets:
                bucket.write_back(self.used_flags, self.as_view)
            now = time.perf_counter()
            self.stats["seconds_communicating"] += _busy_seconds(
                [(b.launched_at, b.done_at or now) for b in self.buckets])
        finally:
            self.expect_hooks = self.require_finalize = False
            self.local_used.zero_()

    # -- join(): a joined rank shadows the buckets of ranks still training ----------------
    def shadow_backward(self) -> None:
        """Reduce zeros in every bucket (and the used-flags), matching a synced backward elsewhere."""
        results = []
        for bucket in self.buckets:
            results.append(self._reduce(bucket.index, bucket.zeros(), bucket.params))
            self.stats["bytes_reduced"] += bucket.nbytes
            self.stats["allreduces"] += 1
        for result in results:
            wait_value(result)
        if self.find_unused:
            dist.all_reduce(torch.zeros_like(self.local_used), op=dist.ReduceOp.MAX, group=self.group)
