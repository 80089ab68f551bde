"""torch profiler events for the plugin's operations, named as gloo names its own.

While torch's profiler runs (``torch.profiler.profile`` or
``torch.autograd.profiler.profile``), every collective and point-to-point operation of a
``ProcessGroupPydist`` records one event "<backend>:<title>" ("pydist:all_reduce",
"pydist:send", "pydist:recvAnySource" ...) whose inputs are the operation's input tensors
(complex ones as their real view, as gloo records them). It starts when the operation is
issued and ends when its Work completes, on pydist's callback runner, so the profiler
marks it asynchronous, as it marks gloo's. With the profiler off, the only cost is one
check of torch's profiler state per operation.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from .work import PydistWork

Method = TypeVar("Method", bound=Callable[..., Any])
Title = str | Callable[[list[torch.Tensor]], str]

profiler_enabled = torch._C._autograd._profiler_enabled


def _recorded(tensor: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(tensor) if tensor.is_complex() and not tensor.is_sparse else tensor


def profiled(title: Title, inputs: Callable[..., list[torch.Tensor]]) -> Callable[[Method], Method]:
    """Decorate a ProcessGroupPydist method returning a PydistWork: while the profiler runs,
    record the event "<self.profiling_name>:<title>" over ``inputs(self, *args)``.

    ``title`` is the operation's name, or a function of the input tensors giving it."""
    def decorate(method: Method) -> Method:
        @functools.wraps(method)
        def run(self, *args: Any, **kwargs: Any) -> Any:
            if not profiler_enabled():
                return method(self, *args, **kwargs)
            return call_recorded(self, title, inputs, method, args, kwargs)
        return run  # type: ignore[return-value]
    return decorate


def call_recorded(group: Any, title: Title, inputs: Callable[..., list[torch.Tensor]], method: Callable[..., Any],
                  args: tuple, kwargs: dict[str, Any] | None = None) -> Any:
    """``method(group, *args, **kwargs)`` recorded as the event "<group.profiling_name>:<title>"
    over ``inputs(group, *args)``, ended when its Work completes (the profiler is running)."""
    kwargs = kwargs or {}
    tensors = inputs(group, *args)
    name = title if isinstance(title, str) else title(tensors)
    record = torch._C._autograd._record_function_with_args_enter(
        f"{group.profiling_name}:{name}", *(_recorded(t) for t in tensors))
    try:
        work: PydistWork | None = method(group, *args, **kwargs)
    except BaseException:
        torch._C._autograd._record_function_with_args_exit(record)
        raise
    if work is None:  # a blocking call that found the profiler stopped (see calls.torch_work): done
        torch._C._autograd._record_function_with_args_exit(record)
        return None
    work.end_record_when_done(record)
    return work


def first_argument(_group: Any, tensors: list[torch.Tensor], *_rest: Any) -> list[torch.Tensor]:
    """The input tensors of allreduce, broadcast, reduce, send and recv: their first argument."""
    return list(tensors)


def second_argument(_group: Any, _outputs: Any, inputs: list[torch.Tensor], *_rest: Any) -> list[torch.Tensor]:
    """The input tensors of allgather(_coalesced), alltoall, gather and the coalesced ones."""
    return list(inputs)


def single_input(_group: Any, _output: torch.Tensor, tensor: torch.Tensor, *_rest: Any) -> list[torch.Tensor]:
    """The input of the single-tensor ops (_allgather_base, _reduce_scatter_base, alltoall_base)."""
    return [tensor]


def first_input_list(_group: Any, _outputs: Any, input_lists: list[list[torch.Tensor]],
                     *_rest: Any) -> list[torch.Tensor]:
    """The input list of reduce_scatter."""
    return list(input_lists[0])


def scattered(group: Any, _outputs: Any, input_lists: list[list[torch.Tensor]], opts: Any) -> list[torch.Tensor]:
    """scatter's inputs: the root's list of tensors to send; nothing on the other ranks."""
    return list(input_lists[0]) if group.rank() == opts.rootRank else []


def no_inputs(*_args: Any) -> list[torch.Tensor]:
    """barrier has no tensors."""
    return []


def all_reduce_title(tensors: list[torch.Tensor]) -> str:
    """gloo's names: "sparse_all_reduce" for a sparse tensor, else "all_reduce"."""
    return "sparse_all_reduce" if tensors and tensors[0].is_sparse else "all_reduce"
