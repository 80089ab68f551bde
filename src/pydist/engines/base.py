"""The interface between process groups and their engines (``Engine``: the native one, MPI's).
torch's backend *names* are another thing: ``pydist.Backend``.

The public API validates arguments and turns tensors into flat numpy arrays; an engine then
runs each collective synchronously in whatever thread the group's OpQueue chooses, given an
OpContext (name, sequence number, deadline, the call's OpSpec), and returns the name of the
algorithm it ran. On failure it only raises (after withdrawing its own pending receives):
what the failure means for the group is decided by the group layer (groups.failure).
Point-to-point operations return transport Requests and do not go through the queue (they
progress independently). Ranks given to an engine are group ranks.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import NamedTuple, Protocol

import numpy as np

from ..core.deadline import Deadline
from ..core.ops import ReduceOp
from ..core.opspec import OpSpec
from ..transport.base import Request


class OpContext(NamedTuple):
    """One operation's name, sequence number in its group, and deadline; ``spec``: what the
    call is (its fingerprint ``spec.call`` goes into every message)."""
    name: str
    seq: int
    deadline: Deadline
    timeout_text: str = "Timed out waiting"  # gloo's wording, with the timeout: core.errors.timed_out_waiting
    spec: OpSpec = OpSpec("operation", "barrier")


class GroupHealth(Protocol):
    """What an engine reads of its group's lifecycle on this rank (the group layer's
    GroupState is one): members known dead, and why an operation cannot go on."""

    @property
    def dead(self) -> Mapping[int, BaseException]:
        """Members known dead: transport rank -> the error that told."""

    def failure(self, sources: list[int]) -> BaseException | None:
        """Why an operation waiting on ``sources`` (transport ranks) cannot go on; None if it can."""

    def evicted(self) -> BaseException | None:
        """The error saying the other members declared this rank dead, if they did."""


class Engine(ABC):
    """A group's communication engine, in group ranks. Each collective returns the name of the
    algorithm it ran (None when the engine has no choice to report, as MPI)."""

    name: str

    @abstractmethod
    def broadcast(self, ctx: OpContext, buf: np.ndarray, root: int) -> str | None: ...

    @abstractmethod
    def all_reduce(self, ctx: OpContext, buf: np.ndarray, op: ReduceOp) -> str | None: ...

    @abstractmethod
    def reduce(self, ctx: OpContext, buf: np.ndarray, root: int, op: ReduceOp) -> str | None: ...

    @abstractmethod
    def all_gather(self, ctx: OpContext, outputs: list[np.ndarray], input: np.ndarray) -> str | None: ...

    @abstractmethod
    def gather(self, ctx: OpContext, input: np.ndarray, outputs: list[np.ndarray] | None, root: int) -> str | None: ...

    @abstractmethod
    def scatter(self, ctx: OpContext, output: np.ndarray, inputs: list[np.ndarray] | None, root: int) -> str | None: ...

    @abstractmethod
    def reduce_scatter(self, ctx: OpContext, output: np.ndarray, inputs: list[np.ndarray],
                       op: ReduceOp) -> str | None: ...

    @abstractmethod
    def all_to_all(self, ctx: OpContext, outputs: list[np.ndarray], inputs: list[np.ndarray]) -> str | None: ...

    @abstractmethod
    def barrier(self, ctx: OpContext) -> str | None: ...

    @abstractmethod
    def isend(self, buf: np.ndarray, dst: int, tag: int) -> Request: ...

    @abstractmethod
    def irecv(self, buf: np.ndarray, src: int | None, tag: int) -> Request: ...

    @abstractmethod
    def cancel(self, request: Request) -> None: ...

    @abstractmethod
    def peer_host(self, rank: int) -> str:
        """Host name of group rank ``rank``."""

    def abort_peers(self, error: BaseException) -> None:  # noqa: B027 - optional hook, default no-op
        """This rank failed an operation of the group with ``error``: tell the other members,
        so that they fail too, naming the root cause. Default: nothing (MPI cannot)."""

    def evicted(self) -> BaseException | None:
        """An EvictedError when the group's other members have declared this rank dead
        (it was silent too long); None otherwise, and by default."""
        return None

    def prepare(self, deadline: Deadline) -> None:  # noqa: B027 - optional hook, default no-op
        """Set up now, within ``deadline``, what the group's first operation would otherwise
        (native: the shared-memory arena); called by every member while the group is made.
        Default: nothing."""

    def close(self) -> None:  # noqa: B027 - optional hook, default no-op
        """Release what this group's engine owns (the world's transport is closed by the world)."""
