"""What an abort says: the payload a rank sends its peers when it aborts a group, and the
error that payload raises on each peer (naming the dead rank when there is one)."""
from __future__ import annotations

import json

from .._errors import DistError, GroupAbortedError, PeerFailedError


def abort_payload(error: BaseException) -> bytes:
    """What an abort tells the peers: the error's text and, if it is a dead peer, which."""
    dead = [error.rank, error.host] if isinstance(error, PeerFailedError) and error.rank is not None else None
    return json.dumps({"message": str(error), "dead": dead}).encode()


def aborted_by(rank: int, host: str, payload: bytes) -> DistError:
    """The error a peer's abort raises here: PeerFailedError naming the dead rank when the
    aborting rank ``rank`` saw one die (so every rank names the root cause), else
    GroupAbortedError naming ``rank``."""
    try:
        data = json.loads(payload)
        message, dead = str(data["message"]), data.get("dead")
    except (ValueError, KeyError, TypeError):
        message, dead = payload.decode(errors="replace"), None
    if dead:
        return PeerFailedError(f"rank {dead[0]} on {dead[1]} failed (rank {rank} on {host} saw it and aborted the "
                               f"group): {message}", rank=dead[0], host=dead[1])
    return GroupAbortedError(f"rank {rank} ({host}) failed and aborted the group: {message}", rank=rank)
