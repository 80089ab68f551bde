"""A segment shared by the members of a group through the store: the lowest member creates
it and publishes its name under ``<key>/name``; the others map it (``share``).

Nothing the store holds is trusted: a member maps the name it reads only after the checks of
:meth:`.segment.Segment.attach` (a pydist name, no link, a regular file of this user, mode
0600, the size and the seal of this group), and it reads the key once. A name that fails
them raises SegmentRefused naming the key, the segment and why: someone who can write the
store (an open job's, or torchrun's agent store) can make a group fail this way, but not
make a rank map memory that its group did not make (see docs/guide/security.md, "Shared
memory").

When /dev/shm has no room for the segment, the creator publishes the binding's
``unavailable`` mark instead of a name (with a secret, MACed: an outsider cannot forge it)
and every member gets None: the group goes without shared memory, together, and the creator
logs why (rate limited).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta

from ...core import deadline as _deadline
from ...core.deadline import Deadline
from ...core.errors import DistStoreError, OpTimeoutError
from ...net.auth import token_of
from ...net.log_limit import LogLimit
from .seal import Binding
from .segment import Segment, SegmentRefused, SharedMemoryFull, remove_stale

#: Seconds between two looks at the store and the members' liveness while waiting for a
#: segment's name, at most: the pauses double from FIRST_POLL_SECONDS up to this, so a name
#: that comes t seconds into the wait is seen by about t + min(t, ALIVE_POLL_SECONDS).
ALIVE_POLL_SECONDS = 0.1
FIRST_POLL_SECONDS = 0.001
#: the longest store value read as a segment's name (longer ones are refused unread)
MAX_VALUE_BYTES = 128
_full_warnings = LogLimit(logging.getLogger("pydist"), "pydist: groups without shared memory (/dev/shm full)")


def share(store, key: str, members: list[int], rank: int, size: int, token: str, purpose: str,
          deadline: Deadline, alive: Callable[[], None] | None = None) -> Segment | None:
    """Create (lowest rank of ``members``) or attach the segment of ``size`` bytes named under
    ``key`` in the store; the last rank to attach unlinks it. None on every member when the
    creator found no room for it in /dev/shm. Raises SegmentRefused (a DistStoreError) for a
    name that is not the group's segment, DistStoreError if the named one is gone. Waiting
    for the creator ends with OpTimeoutError naming it at ``deadline``, or with whatever
    ``alive()`` raises (a member is dead, the group was aborted), checked at least every
    ALIVE_POLL_SECONDS."""
    creator, name_key = min(members), f"{key}/name"
    binding = Binding(key, token, size, token_of(store))
    if rank == creator:
        remove_stale()
        try:
            segment = Segment.create(token, purpose, binding)
        except SharedMemoryFull as error:
            _full_warnings.warning("pydist: %s. The ranks %s go without shared memory for this (%s): slower, "
                                   "over the network transport.", error, members, key)
            store.set(name_key, binding.unavailable())
            return None
        store.set(name_key, segment.name)
    else:
        _wait_for_name(store, name_key, creator, deadline, alive)
        value = store.get(name_key)
        if len(value) <= MAX_VALUE_BYTES and binding.is_unavailable(value.decode("ascii", "replace")):
            return None
        segment = _attach(name_key, value, binding, creator)
    if store.add(f"{key}/attached", 1) == len(members):
        segment.unlink()
    return segment


def _attach(key: str, value: bytes, binding: Binding, creator: int) -> Segment:
    """Map the segment rank ``creator`` named under ``key`` (``value``); SegmentRefused if it
    is not that, DistStoreError if it is gone."""
    name = value[:MAX_VALUE_BYTES].decode("ascii", "replace")
    try:
        if len(value) > MAX_VALUE_BYTES:
            raise SegmentRefused(f"a value of {len(value)} bytes is not a pydist segment name")
        return Segment.attach(name, binding)
    except SegmentRefused as error:
        raise SegmentRefused(f"refusing the shared memory named under store key {key!r}: {error}. Rank {creator} "
                             f"did not make it for this group: whoever can write this job's store may have "
                             "pointed the key at it (see docs/guide/security.md, 'Shared memory')") from None
    except FileNotFoundError:
        raise DistStoreError(f"the shared memory named under store key {key!r} ({name}) is gone: rank {creator} "
                             "exited before every member attached, or the key was left in this store by an "
                             "earlier run (a restarted job that reuses its store needs a key prefix per "
                             "attempt, e.g. TORCHELASTIC_RESTART_COUNT's)") from None


def _wait_for_name(store, key: str, creator: int, deadline: Deadline, alive: Callable[[], None] | None) -> None:
    """Until ``key`` is in the store. Without ``alive``: one wait to the deadline. With it: a
    look (``check``) then ``alive()`` then a pause, over again, never a short ``wait``: torch's
    TCPStore client logs two warnings each time one of its waits expires, so polling with
    waits of 0.1 s printed 20 lines a second on a rank waiting for a late creator."""
    pause = FIRST_POLL_SECONDS
    while True:
        left = deadline.remaining()  # None: no deadline
        if alive is None:
            try:
                store.wait([key], timedelta(days=365) if left is None else timedelta(seconds=max(left, 0.001)))
                return
            except DistStoreError:  # the wait timed out (the torch plugin's store raises pydist's errors too)
                pass
        elif store.check([key]):
            return
        else:
            alive()
        if deadline.expired():
            raise OpTimeoutError(f"Timed out waiting for rank {creator} to create the shared memory (it has not "
                                 "reached this operation or is stuck)") from None
        if alive is not None:
            _deadline.pause(pause if left is None else min(pause, left))  # on pydist's clock, as the deadline
            pause = min(2 * pause, ALIVE_POLL_SECONDS)
