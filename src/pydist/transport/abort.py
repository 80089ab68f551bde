"""What an abort says: the payload a rank sends its peers when it aborts a group, and the
error that payload raises on each peer.

The payload carries the first-hand account of the failure, not the text of a relayed error:
a death is named once (with the rank that saw it first and the ranks known dead) however
many ranks pass the abort on, and any other failure names the rank that failed first.
"""
from __future__ import annotations

import json
from collections.abc import Iterable

from ..core.errors import DistError, GroupAbortedError, PeerFailedError

#: the most of an error's message an abort carries: JSON's escapes (6 bytes a character at
#: most) keep it well inside an ABORT frame's limit (framing.CONTROL_LIMITS)
MESSAGE_CHARS = 64 << 10


def abort_payload(error: BaseException, known_dead: Iterable[int] = ()) -> bytes:
    """What an abort caused by ``error`` tells the peers; ``known_dead``: the group's
    members this rank knows are dead."""
    data: dict = {"message": str(error), "known_dead": sorted(known_dead)}
    if isinstance(error, PeerFailedError) and error.rank is not None:
        data.update(message=error.reason, dead=[error.rank, error.host], witness=error.witness)
    elif isinstance(error, GroupAbortedError) and error.rank is not None:
        data.update(message=error.reason, origin=[error.rank, error.host])
    data["message"] = str(data["message"])[:MESSAGE_CHARS]  # an ABORT frame's payload is bounded
    return json.dumps(data).encode()


def aborted_by(rank: int, host: str, payload: bytes) -> DistError:
    """The error a peer's abort raises here: PeerFailedError naming the dead rank when the
    aborting rank ``rank`` (on ``host``), or the rank it heard from, saw one die; else
    GroupAbortedError naming the rank that failed first."""
    try:
        data = json.loads(payload)
        message = str(data["message"])
    except (ValueError, KeyError, TypeError):
        data, message = {}, payload.decode(errors="replace")
    dead = data.get("dead")
    if dead:
        witness = data.get("witness") or [rank, host]
        known = sorted(set(data.get("known_dead") or ()) | {dead[0]})
        note = f"rank {witness[0]} on {witness[1]} saw it and aborted the group"
        if len(known) > 1:
            note += f"; ranks known dead: {', '.join(map(str, known))}"
        return PeerFailedError(f"rank {dead[0]} on {dead[1]} failed ({note}): {message}", rank=dead[0],
                               host=dead[1], reason=message, witness=(witness[0], witness[1]))
    origin = data.get("origin") or [rank, host]
    return GroupAbortedError(f"rank {origin[0]} ({origin[1]}) failed and aborted the group: {message}",
                             rank=origin[0], host=origin[1], reason=message)
