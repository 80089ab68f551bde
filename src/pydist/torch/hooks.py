"""DDP communication hooks on pydist: torch's ``ddp_comm_hooks.default_hooks``, same names.

A hook is ``hook(state, bucket) -> torch.futures.Future[torch.Tensor]``: ``state`` is a
pydist ProcessGroup or None (pydist's default group), ``bucket`` a GradBucket whose
``buffer()`` holds this rank's gradients, not pre-divided; the Future's value is the
reduced flat tensor, which DDP writes back into the gradients.

- ``allreduce_hook``: divide by the group size, all_reduce (SUM); same result as no hook.
- ``fp16_compress_hook`` / ``bf16_compress_hook``: cast to float16 / bfloat16, divide,
  all_reduce in that dtype, cast back into the bucket (half the bytes on the wire).

torch's own hooks call ``torch.distributed.all_reduce`` on torch's process groups, which
a pydist group is not. So ``DistributedDataParallel.register_comm_hook`` replaces torch's
three default hooks by these (``pydist_equivalent``), with ``state`` a pydist group or
None; any other torch hook (PowerSGD, a hook calling torch.distributed) runs unchanged
and needs torch.distributed initialised (e.g. with the "pydist" backend plugin): it
communicates over torch's groups, and DDP only consumes the torch Future it returns.
torch's ``fp16_compress_wrapper``/``bf16_compress_wrapper`` work around these hooks as is.

Futures settle on pydist's callback runner, off the progress thread: a ``.then`` callback may
wait on another collective.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import pydist as dist
from pydist import ProcessGroup

__all__ = ["allreduce_hook", "bf16_compress_hook", "fp16_compress_hook", "pydist_equivalent", "work_future"]


def work_future(work: Any, value: Any) -> torch.futures.Future:
    """A torch Future that resolves to ``value`` when pydist's ``work`` completes (or fails)."""
    future: torch.futures.Future = torch.futures.Future()

    def settle(done: Any) -> None:
        error = done.exception()
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    work.add_done_callback(settle)
    return future


def check_state(state: Any) -> None:
    """TypeError unless ``state`` is what the default hooks take: a pydist ProcessGroup or None."""
    if state is not None and not isinstance(state, ProcessGroup):
        raise TypeError(f"state: pydist's communication hooks take a pydist ProcessGroup or None (the default "
                        f"group), got {type(state).__name__}; torch's process groups cannot carry pydist collectives")


def allreduce_hook(process_group: ProcessGroup | None, bucket: Any) -> torch.futures.Future:
    """Average the bucket over the group: divide by its size, then all_reduce (SUM) in place."""
    check_state(process_group)
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size(process_group))  # divide first: no overflow in low precision
    return work_future(dist.all_reduce(tensor, group=process_group, async_op=True), tensor)


def _compress_hook(dtype: torch.dtype, process_group: ProcessGroup | None, bucket: Any) -> torch.futures.Future:
    check_state(process_group)
    buffer = bucket.buffer()
    compressed = buffer.to(dtype).div_(dist.get_world_size(process_group))

    def decompress(future: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(future.value())  # in place: no second full-precision buffer
        return buffer

    return work_future(dist.all_reduce(compressed, group=process_group, async_op=True), compressed).then(decompress)


def fp16_compress_hook(process_group: ProcessGroup | None, bucket: Any) -> torch.futures.Future:
    """Cast the bucket to float16, divide by the group size, all_reduce, cast back."""
    return _compress_hook(torch.float16, process_group, bucket)


def bf16_compress_hook(process_group: ProcessGroup | None, bucket: Any) -> torch.futures.Future:
    """Cast the bucket to bfloat16, divide by the group size, all_reduce, cast back."""
    return _compress_hook(torch.bfloat16, process_group, bucket)


DEFAULT_HOOKS = (allreduce_hook, fp16_compress_hook, bf16_compress_hook)


def pydist_equivalent(hook: Callable) -> Callable:
    """pydist's hook for one of torch's default hooks (allreduce/fp16/bf16); others unchanged."""
    try:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    except ImportError:  # torch built without distributed support
        return hook
    table = {default_hooks.allreduce_hook: allreduce_hook, default_hooks.fp16_compress_hook: fp16_compress_hook,
             default_hooks.bf16_compress_hook: bf16_compress_hook}
    return table.get(hook, hook)
