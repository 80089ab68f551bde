"""How the plugin's methods run torch's calls (ProcessGroupPydist's collectives and
point-to-point): the one wrapper every method has (``operation``: tensors on another device
go to that device's backend, a running profiler records the call), torch's reduce op as
pydist's (``pydist_op``), whether torch asks for an async call (``asks_async``) and the Work
returned for pydist's (``torch_work``): a blocking call runs now as pydist's blocking calls
run, an async one is queued. Every torch call pays what is here: each
step is measured (tools/torch_layers.py) and kept to a few Python operations.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
import torch.distributed as tdist

from ..core.ops import RedOpType, ReduceOp
from ..groups.work import Work
from ._profiling import Title, call_recorded, profiler_enabled
from .devices import forward
from .work import FinishedWork, PydistWork

Method = TypeVar("Method", bound=Callable[..., Any])


def _ops_by_hash() -> dict[int, RedOpType]:
    """hash(torch's ReduceOp) -> pydist's RedOpType, for the ops without a factor: torch hashes
    a ReduceOp (and a RedOpType) as its op's value, read in ~0.06 us where ``.op.value`` takes
    ~0.3. Empty (every look-up then takes the long way) unless each op's hash is its own and
    none is PREMUL_SUM's, so that no hash can stand for another op."""
    kinds = tdist.ReduceOp.RedOpType
    ops: dict[int, RedOpType] = {hash(tdist.ReduceOp(getattr(kinds, op.name))): op for op in RedOpType
           if op is not RedOpType.PREMUL_SUM}
    if len(ops) != len(RedOpType) - 1 or hash(kinds.PREMUL_SUM) in ops:
        return {}
    return ops


_OPS = _ops_by_hash()


def pydist_op(reduce_op: Any) -> RedOpType | ReduceOp:
    """torch's ReduceOp as pydist's: the RedOpType (pydist's API's default spelling, so that
    both find their calls' description at once: core.opspec.describe), or PREMUL_SUM's
    ReduceOp with its factor."""
    found = _OPS.get(hash(reduce_op))
    if found is not None:
        return found
    kind = getattr(reduce_op, "op", reduce_op)
    op = RedOpType[kind.name] if hasattr(kind, "name") else RedOpType(int(kind))
    if op is not RedOpType.PREMUL_SUM:
        return op
    factor = getattr(reduce_op, "factor", None)
    if factor is None:
        raise RuntimeError(f"PREMUL_SUM: this torch ({torch.__version__}) does not show the factor of a "
                           "ReduceOp made by _make_nccl_premul_sum to a Python backend (ReduceOp.factor, "
                           "torch 2.13 and later); multiply the tensor and reduce with SUM instead")
    return ReduceOp(op, factor.item() if hasattr(factor, "item") else float(factor))


def operation(title: Title, inputs: Callable[..., list[torch.Tensor]],
              several: bool = False) -> Callable[[Method], Method]:
    """Decorate a collective or point-to-point method: run the call on the group's torch
    backend for its tensors' device when they are not all on the CPU (see
    ProcessGroupPydist.route), else on pydist, recorded as a profiler event while torch's
    profiler runs (see _profiling: ``title``, ``inputs``). One wrapper: every call of torch
    code pays it. A group without other devices' backends looks at the devices only when
    pydist refuses the call (ValueError: every call checks its tensors before anything is
    sent), so that a tensor on a device it cannot run gets the group's own error (~0.25 us
    a call saved). ``several``: the method makes several pydist calls (the coalesced ones),
    the first of which could run before a later one is refused: its devices are looked at
    first, always."""
    def decorate(method: Method) -> Method:
        name = method.__name__

        @functools.wraps(method)
        def run(self, *args: Any) -> Any:
            if (several or self.device_backends) and not on_cpu(args):
                backend = self.route(name, args)
                if backend is not None:
                    return forward(backend, name, args)
            try:
                if profiler_enabled():
                    return call_recorded(self, title, inputs, method, args)
                return method(self, *args)
            except ValueError:
                if not on_cpu(args):
                    self.route(name, args)  # raises where no backend runs these tensors
                raise
        return run  # type: ignore[return-value]
    return decorate


def on_cpu(args: Iterable[Any]) -> bool:
    """Every tensor in an operation's arguments (lists of them, lists of lists) is on the CPU.
    (Classes are told first: lists, then those met before that hold no tensor (torch's
    options, ints), as a failing isinstance costs ~50 ns.)"""
    for arg in args:
        kind = arg.__class__
        if kind is list or kind is tuple:
            if not on_cpu(arg):
                return False
        elif kind in _NO_TENSORS:
            continue
        elif isinstance(arg, _Tensor):
            if not arg.is_cpu:
                return False
        elif isinstance(arg, (list, tuple)):
            if not on_cpu(arg):
                return False
        else:
            _NO_TENSORS.add(kind)
    return True


_Tensor = torch.Tensor
_NO_TENSORS: set[type] = set()  # classes of arguments that are neither tensors nor lists (a few)


def asks_async(opts: Any) -> bool:
    """Whether torch asks for an async call: its options' ``asyncOp``, set False by torch 2.8
    and later for a blocking call (torch then waits on the Work at once); True for C++
    callers' default options and DDP's buckets, for no options, and on a torch whose options
    have no ``asyncOp``."""
    return opts is None or getattr(opts, "asyncOp", True)


def torch_work(async_op: bool, work: Work | None, outputs: list[Any]) -> PydistWork | None:
    """What the plugin's method returns for pydist's call that returned ``work`` (its outputs:
    ``outputs``). An async call's Work, which pydist queued. A blocking call ran as pydist's
    own blocking calls do (in this thread on an idle group, else after the calls queued
    before it) and raised its error at the call: None, which torch's functions take as a call
    that has synced ("the backend has sync'ed at CPP level"), saving a Work and a wait
    (~0.6 us); a FinishedWork instead where torch keeps each call's Work for a later
    ``wait_tensor`` (``_allow_inflight_collective_as_graph_input``), or its profiler runs
    (the event ends on the Work's completion, off this thread, as gloo's: see _profiling).
    Each method passes pydist's function its arguments directly (no ``*args, **kwargs``
    relay: ~0.3 us a call)."""
    if async_op:
        return PydistWork(work, outputs)
    return FinishedWork(outputs) if _keeps_works() or profiler_enabled() else None


_keeps_works = getattr(torch._C._distributed_c10d, "_allow_inflight_collective_as_graph_input", lambda: False)
