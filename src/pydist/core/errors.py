"""Exception types, named as torch.distributed names them; all are RuntimeError.

- DistError: base of every pydist failure that is not misuse.
- DistBackendError: an operation failed or timed out inside a backend (DesyncError: ranks
  called different operations).
- DistNetworkError: a peer or the network failed (peer rank and host in the message,
  the OS error as ``__cause__``).
- DistStoreError: a store operation failed or timed out (missing keys in the message).
- QueueEmptyError: ``queue_pop(block=False)`` on an empty queue.
- ConfigurationError (a mixin): the job's configuration is wrong, the same on every rank (a
  variable's value, a variable missing, an interface name); SettingError is also a
  ValueError, InterfaceError also a DistNetworkError. pydist-run reports one once per job.

Misuse (bad rank, wrong sizes, non-member) raises ValueError/TypeError instead.
"""
from __future__ import annotations


class DistError(RuntimeError):
    """Base class of pydist's runtime failures. ``dead_ranks``: the ranks of the group (global
    ranks of the current world) this rank knew dead when an operation raised it, for
    ``shrink_group``; empty when none or not an operation's error."""

    dead_ranks: frozenset[int] = frozenset()


class DistBackendError(DistError):
    """A collective or point-to-point operation failed or timed out."""


class DistNetworkError(DistError):
    """A connection to a peer or to the store failed."""


class DistStoreError(DistError):
    """A store operation failed or timed out."""


class QueueEmptyError(DistStoreError):
    """A non-blocking queue_pop found the queue empty."""


class OpTimeoutError(DistBackendError):
    """An operation passed its deadline; the message names the operation, its sequence
    number, the rank waited for and the ranks that never reached it."""

    #: True once the ranks that never reached the operation were looked up and appended.
    explained = False


class DesyncError(DistBackendError):
    """Ranks called different operations (or the same with different arguments) at the same
    point of a group's sequence; the message names both ranks and both calls."""


class GroupAbortedError(DistBackendError):
    """Another rank of the group failed an operation and told this rank; ``rank`` (on
    ``host``) names the first to fail, ``reason`` is its own account of the failure."""

    def __init__(self, message: str, rank: int | None = None, host: str | None = None,
                 reason: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.host = host
        self.reason = message if reason is None else reason


class ConfigurationError(Exception):
    """Mixin of the errors in a job's configuration (an environment variable's value, a
    variable missing, an interface name): the same on every rank and fixed outside the code,
    so pydist-run prints one paragraph per job for it rather than a traceback per rank."""


class SettingError(ConfigurationError, ValueError):
    """An environment variable is missing or has a bad value; the message names it."""


class InterfaceError(ConfigurationError, DistNetworkError):
    """PYDIST_SOCKET_IFNAME (or GLOO_SOCKET_IFNAME) names no interface with an address here."""


class PeerFailedError(DistNetworkError):
    """A peer rank died or its connection broke; ``rank`` and ``host`` name it. ``reason`` is
    the first-hand account (of the rank that saw it, ``witness`` when that was another rank)."""

    def __init__(self, message: str, rank: int | None = None, host: str | None = None,
                 reason: str | None = None, witness: tuple[int, str] | None = None):
        super().__init__(message)
        self.rank = rank
        self.host = host
        self.reason = message if reason is None else reason
        self.witness = witness


class EvictedError(DistBackendError):
    """This rank's peers declared it dead (it did not answer for PYDIST_PEER_TIMEOUT: stopped,
    stuck, or cut off) and went on without it; ``rank`` (on ``host``) is the peer that said so.
    It cannot take part in their groups again; a replacement process can join the job."""

    def __init__(self, message: str, rank: int | None = None, host: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.host = host


def timed_out_waiting(seconds: float | None) -> str:
    """gloo's wording of a timeout, "Timed out waiting 1000ms" (whole milliseconds), which
    torch's tests and code written against gloo match; "Timed out waiting" without one."""
    return "Timed out waiting" if seconds is None else f"Timed out waiting {max(0, round(seconds * 1000))}ms"
