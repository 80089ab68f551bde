"""What a BYE frame says (its JSON payload) and what the peer that reads it then reports.

A rank's BYE is one of: empty (it shut down its process group: destroy_process_group);
``{"after": FAILURE}`` (the same, after it heard that a peer failed: FAILURE, "rank 0 on
host failed", which the peers that wait on it name too: they may not have heard of it yet);
``{"reason": ...}`` (it declared the receiver dead, see tcp.connection.notify);
``{"exit": CAUSE}`` (its process is ending with its groups alive, ``announce_exit``: CAUSE is
the failure that ends it, e.g. "ValueError: bad input", or "" when none was seen). The
payload stays small: CAUSE is cut at core.exit_cause.MAX_CAUSE characters.
"""
from __future__ import annotations

import json

from ..core.exit_cause import MAX_CAUSE


def exit_payload(cause: str | None) -> bytes:
    """The BYE payload of a process ending with its groups alive because of ``cause`` (None: no failure seen)."""
    return json.dumps({"exit": (cause or "")[:MAX_CAUSE]}).encode()


def shutdown_payload(failure: str | None) -> bytes:
    """The BYE payload of destroy_process_group: empty, or the first peer ``failure`` this
    rank heard of before it left."""
    return json.dumps({"after": failure[:MAX_CAUSE]}).encode() if failure else b""


def shutdown(who: str, me: int, after: str | None) -> str:
    """How rank ``me`` reports a peer (``who``: "rank 1 on host") that shut down its process
    group, ``after`` a failure it heard of (None: none)."""
    cause = f" after {after}" if after else ""
    return (f"{who} has shut down its process group (destroy_process_group){cause}; rank {me} "
            "cannot exchange more messages with it")


def read_payload(payload: bytes) -> dict:
    """A BYE's payload as a dict ({} when empty; {"reason": text} when it is not JSON)."""
    if not payload:
        return {}
    try:
        data = json.loads(payload)
    except ValueError:
        data = None
    return data if isinstance(data, dict) else {"reason": payload.decode(errors="replace")}


def departure(who: str, me: int, cause: str | None) -> str:
    """How rank ``me`` reports a peer (``who``: "rank 1 on host") whose process ended with its
    groups alive: failed with ``cause``, or ("", None) exited without destroy_process_group."""
    if cause:
        return f"{who} failed ({cause}); its process is ending, so rank {me} cannot exchange more messages with it"
    return f"{who} exited without destroy_process_group; rank {me} cannot exchange more messages with it"
