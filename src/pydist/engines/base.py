"""The interface between process groups and their engines (``Engine``: the native one, MPI's).
torch's backend *names* are another thing: ``pydist.Backend``.

The public API validates arguments and turns tensors into flat numpy arrays; a backend
then runs each collective synchronously in whatever thread the group's OpQueue chooses,
given an OpContext (name, sequence number, deadline). Point-to-point operations return
transport Requests and do not go through the queue (they progress independently).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, NamedTuple

import numpy as np

from ..core.deadline import Deadline
from ..core.errors import OpTimeoutError
from ..groups.state import GroupState
from ..core.opspec import OpSpec
from ..core.ops import ReduceOp
from ..transport.base import Request


class OpContext(NamedTuple):
    """One operation's name, sequence number in its group, and deadline; ``explain`` turns
    its timeout into one naming the ranks that never reached it (a bounded store lookup);
    ``spec``: what the call is (its fingerprint ``spec.call`` goes into every message);
    ``entry``: its flight-recorder entry (None: not recorded), where the engine notes the
    algorithm it chose."""
    name: str
    seq: int
    deadline: Deadline
    timeout_text: str = "Timed out waiting"  # gloo's wording, with the timeout: _errors.timed_out_waiting
    explain: Callable[[OpTimeoutError, int], OpTimeoutError] | None = None  # (timeout, seq)
    spec: OpSpec = OpSpec("operation", "barrier")
    entry: Any = None

    def explained(self, error: BaseException) -> BaseException:
        """``error``, or for a timeout not explained yet, the explained one."""
        if isinstance(error, OpTimeoutError) and not error.explained and self.explain is not None:
            return self.explain(error, self.seq)
        return error


class Engine(ABC):
    """A group's communication engine, in group ranks."""

    name: str

    @abstractmethod
    def broadcast(self, ctx: OpContext, buf: np.ndarray, root: int) -> None: ...

    @abstractmethod
    def all_reduce(self, ctx: OpContext, buf: np.ndarray, op: ReduceOp) -> None: ...

    @abstractmethod
    def reduce(self, ctx: OpContext, buf: np.ndarray, root: int, op: ReduceOp) -> None: ...

    @abstractmethod
    def all_gather(self, ctx: OpContext, outputs: list[np.ndarray], input: np.ndarray) -> None: ...

    @abstractmethod
    def gather(self, ctx: OpContext, input: np.ndarray, outputs: list[np.ndarray] | None, root: int) -> None: ...

    @abstractmethod
    def scatter(self, ctx: OpContext, output: np.ndarray, inputs: list[np.ndarray] | None, root: int) -> None: ...

    @abstractmethod
    def reduce_scatter(self, ctx: OpContext, output: np.ndarray, inputs: list[np.ndarray], op: ReduceOp) -> None: ...

    @abstractmethod
    def all_to_all(self, ctx: OpContext, outputs: list[np.ndarray], inputs: list[np.ndarray]) -> None: ...

    @abstractmethod
    def barrier(self, ctx: OpContext) -> None: ...

    @abstractmethod
    def isend(self, buf: np.ndarray, dst: int, tag: int) -> Request: ...

    @abstractmethod
    def irecv(self, buf: np.ndarray, src: int | None, tag: int) -> Request: ...

    @abstractmethod
    def cancel(self, request: Request) -> None: ...

    @abstractmethod
    def peer_host(self, rank: int) -> str:
        """Host name of group rank ``rank``."""

    def peer_failed(self, error: BaseException) -> None:  # noqa: B027 - optional hook, default no-op
        """A point-to-point operation found a dead peer: tell the group (default: nothing)."""

    def close(self) -> None:  # noqa: B027 - optional hook, default no-op
        """Release what this group's backend owns (the world's transport is closed by the world)."""

    def group_state(self, ranks: list[int]) -> GroupState:
        """The lifecycle object of the group this backend serves (``ranks``: its world
        ranks): the one the transport records aborts and dead ranks in, or (default, a
        backend without such a transport) a new one."""
        return GroupState(members=ranks)
