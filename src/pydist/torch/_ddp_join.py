"""``DistributedDataParallel.join()``: training with uneven inputs (torch's ``Join`` + DDP's join hook).

Every forward of a rank still training starts with an async all_reduce of 1 (the "still
training?" vote). A rank that has run out of data leaves the ``with`` body and, in
``__exit__``, votes 0 in a loop: a non-zero total means some ranks are still training, so
it shadows one of their iterations, issuing the same collectives in the same order with
neutral inputs:

    still-training vote (SUM)                      | vote 0
    buffer source: MAX of training ranks' ranks    | MAX with -1, then the buffer broadcast
    will-backward-sync vote (SUM)                  | vote 0; learns whether to shadow backward
    one all_reduce per bucket, in bucket order     | zeros (through the comm hook, if any)
    used-parameter flags (find_unused_parameters)  | zeros

A total of 0 means every rank has joined: the last rank to join is the authoritative copy
(MAX over the last joiners' ranks) and broadcasts its parameters and buffers to all, so the
models end equal. Gradients are divided by the initial world size
(``divide_by_initial_world_size=True``, joined ranks count as zeros) or by the number of
ranks still training. ``throw_on_early_termination=True`` makes every rank raise as soon
as one has run out of data instead.
"""
from __future__ import annotations

import warnings
from types import TracebackType
from typing import Any, Protocol

import torch

import pydist as dist

from ._ddp_reducer import Reducer
from ._ddp_sync import broadcast_coalesced, find_common_rank

SKEW_WARNING = 1000


class JoinConfig:
    """How a DDP module behaves inside ``join()``."""

    def __init__(self, enable: bool = False, throw_on_early_termination: bool = False,
                 divide_by_initial_world_size: bool = True):
        self.enable = enable
        self.throw_on_early_termination = throw_on_early_termination
        self.divide_by_initial_world_size = divide_by_initial_world_size


class Joinable(Protocol):
    """What join needs of the DDP module (ddp.DistributedDataParallel; named structurally
    so that this module does not import ddp, which imports it)."""
    process_group: dist.ProcessGroup
    reducer: Reducer
    broadcast_buffers: bool
    require_backward_grad_sync: bool
    require_forward_param_sync: bool
    _join_config: JoinConfig

    def will_sync_module_buffers(self) -> bool: ...

    def _module_buffers(self) -> list[torch.Tensor]: ...

    def _named_params(self) -> list[tuple[str, torch.Tensor]]: ...


def _sum(value: float, group: Any, async_op: bool = False) -> tuple[Any, torch.Tensor]:
    tensor = torch.tensor([value], dtype=torch.float32)
    return dist.all_reduce(tensor, group=group, async_op=async_op), tensor


def notify_still_training(ddp: Joinable) -> None:
    """Start of a forward inside join(): vote "still training" (and maybe learn of a joined rank)."""
    config = ddp._join_config
    work, count = _sum(1.0, ddp.process_group, async_op=True)
    ddp.reducer.set_divisor_source(work, count, config.divide_by_initial_world_size)
    if config.throw_on_early_termination:
        _, joined = _sum(0.0, ddp.process_group)
        if joined.item():
            raise RuntimeError("Detected at least one rank that exhausted inputs. Throwing across all ranks.")


def vote_backward_sync(ddp: Joinable, joined: bool) -> bool:
    """The will-backward-sync vote: a training rank votes its intent, a joined rank learns the total."""
    _, votes = _sum(1.0 if not joined and ddp.require_backward_grad_sync else 0.0, ddp.process_group,
                       async_op=not joined)
    return joined and votes.item() != 0


class Join:
    """The context manager ``DistributedDataParallel.join()`` returns."""

    def __init__(self, ddp: Joinable, divide_by_initial_world_size: bool = True,
                 enable: bool = True, throw_on_early_termination: bool = False):
        self.ddp = ddp
        self.config = JoinConfig(enable, throw_on_early_termination, divide_by_initial_world_size)

    def __enter__(self) -> Join:
        self.ddp._join_config = self.config
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        ddp = self.ddp
        try:
            if not self.config.enable or kind is not None:
                return  # an exception propagates as is
            last_joiner, shadowed = True, 0
            while _sum(0.0, ddp.process_group)[1].item() != 0:
                if self.config.throw_on_early_termination:
                    _sum(1.0, ddp.process_group)
                    raise RuntimeError(f"Rank {ddp.process_group.rank()} exhausted all inputs.")
                if shadowed == SKEW_WARNING:
                    warnings.warn(f"Detected uneven input skew of greater than {SKEW_WARNING}: rank "
                                  f"{ddp.process_group.rank()} has that many fewer inputs than the ranks still "
                                  "training; this skew slows training down", stacklevel=2)
                shadow_iteration(ddp)
                last_joiner, shadowed = False, shadowed + 1
            sync_final_model(ddp, last_joiner)
        finally:
            ddp._join_config = JoinConfig()


def shadow_iteration(ddp: Joinable) -> None:
    """Issue one training iteration's collectives with neutral inputs (DDP's join main hook)."""
    if ddp.will_sync_module_buffers():
        source = find_common_rank(ddp.process_group, False)
        broadcast_coalesced(ddp._module_buffers(), ddp.process_group, source)
    should_sync = vote_backward_sync(ddp, joined=True)
    ddp.require_forward_param_sync = should_sync
    if should_sync:
        ddp.reducer.shadow_backward()


def sync_final_model(ddp: Joinable, is_last_joiner: bool) -> None:
    """Every rank takes the parameters and buffers of the (highest-ranked) last joiner."""
    source = find_common_rank(ddp.process_group, is_last_joiner)
    states = [p for _, p in ddp._named_params()]
    if ddp.broadcast_buffers:
        states += ddp._module_buffers()
    broadcast_coalesced(states, ddp.process_group, source)
