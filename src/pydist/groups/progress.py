"""Which operation each rank last started, published through the store, so that a timeout
can name the ranks that never reached the operation.

Each rank's :class:`ProgressBoard` records (sequence number, name) of the latest operation it
started on each group — a dict assignment per operation — and a ``pydist-progress`` thread
writes the record, with its wall-clock time, to the store key ``progress/<rank>``: once a
second, and at once (within ``SETTLE_SECONDS``) when the record has stopped changing, so a
rank waiting inside an operation is seen there ~0.2 s after it started it. In a large world
both slow down (``Pace``) so that all ranks together send the store at most
STORE_SETS_PER_SECOND: its one server thread answers ~8,000 requests a second. At a timeout,
:meth:`ProgressBoard.explain` reads every member's record and names those behind; a record
older than ``Pace.stale`` (its rank cut off from the store keeps it) is given apart, with its
age.
"""
from __future__ import annotations

import json
import threading
import time

from ..core import deadline as _deadline

#: Seconds between publications while the record keeps changing.
PUBLISH_INTERVAL = 1.0
#: Seconds without a change after which a changed record is published (the thread's tick).
SETTLE_SECONDS = 0.1
#: What the boards of one world send the store at most, all ranks together (sets per second).
STORE_SETS_PER_SECOND = 2000
#: Seconds a timed-out operation spends at most asking the store which ranks are behind
#: (10 % of the timeout when that is less), so the error comes at the deadline.
EXPLAIN_BUDGET = 2.0
#: Seconds close() waits for a publication in flight (a store that does not answer must not
#: hold up destroy_process_group; the thread is a daemon and ends when the store closes).
CLOSE_WAIT = 0.5


class Pace:
    """How often each rank of a ``size``-rank world publishes: at least ``gap`` seconds
    between two publications (so all ranks together stay within STORE_SETS_PER_SECOND; below
    STORE_SETS_PER_SECOND * SETTLE_SECONDS ranks the gap is under a tick and changes nothing),
    an unchanged record every ``interval`` (PUBLISH_INTERVAL, or twice the gap past 1,000
    ranks); ``stale``: the age after which a reader gives a record as not heard from lately."""

    def __init__(self, size: int = 1):
        self.gap = size / STORE_SETS_PER_SECOND
        self.interval = max(PUBLISH_INTERVAL, 2 * self.gap)
        self.stale = 2 * self.interval


def publication_due(version: int, seen: int, published: int, since_publication: float,
                    pace: Pace | None = None) -> bool:
    """At a tick: publish record ``version`` (``seen`` at the previous tick, ``published``
    last written ``since_publication`` seconds ago)? Yes if it changed and has settled (no
    change since the last tick) and ``pace.gap`` has passed, and once every ``pace.interval``
    in any case (the record's time then tells readers the rank is still heard from);
    ``pace``: Pace() when not given (a small world)."""
    pace = pace or Pace()
    return since_publication >= pace.interval or (version != published and version == seen
                                                  and since_publication >= pace.gap)


class ProgressBoard:
    """This rank's latest operation per group, and the other ranks' as published."""

    def __init__(self, store, rank: int, size: int = 1):
        self._store = store
        self._rank = rank
        self.pace = Pace(size)
        self._latest: dict[int, tuple[int, str]] = {}  # by group id (JSON writes the keys as strings)
        self._version = 0  # bumped by every started()
        self._stop = threading.Event()
        self._publish()  # the key exists from the start: readers never block on it
        self._thread = threading.Thread(target=self._run, name=f"pydist-progress-{rank}", daemon=True)
        self._thread.start()

    def started(self, group_id: int, seq: int, name: str) -> None:
        """This rank starts operation ``seq`` (``name``) of group ``group_id``."""
        self._latest[group_id] = (seq, name)
        self._version += 1

    def _publish(self) -> None:
        latest: dict = dict(self._latest)  # one atomic copy: started() may add a group meanwhile
        latest["at"] = time.time()  # wall clock: a reader says how old the record is
        self._store.set(f"progress/{self._rank}", json.dumps(latest))

    def _run(self) -> None:
        published = seen = self._version
        since = 0.0
        while not self._stop.wait(SETTLE_SECONDS):  # real time: a publication rate, not a timeout
            since += SETTLE_SECONDS
            version = self._version
            if publication_due(version, seen, published, since, self.pace):
                try:
                    self._publish()
                except Exception:  # the store is gone (shutdown, failure): the op errors say why
                    return
                published, since = version, 0.0
            seen = version

    def close(self) -> None:
        """Stop publishing; wait at most CLOSE_WAIT for a publication in flight."""
        self._stop.set()
        _deadline.join(self._thread, CLOSE_WAIT)

    def explain(self, group_id: int, seq: int, ranks: list[int], budget: float = EXPLAIN_BUDGET) -> str:
        """Which of ``ranks`` (world ranks) had not started operation ``seq`` of the group,
        as last published; a note instead when the store does not answer within ``budget``
        seconds (its host stopped or unreachable: the timeout error must not wait for the
        store's own timeout) or when it failed (its host's process is gone)."""
        answer: list[str] = []
        asking = threading.Thread(target=lambda: answer.append(self._ask(group_id, seq, ranks)),
                                  name=f"pydist-explain-{self._rank}", daemon=True)
        asking.start()
        _deadline.join(asking, budget)
        if not answer:
            return f"; which ranks never reached it is unknown: the store did not answer within {budget:g} s"
        return answer[0]

    def _ask(self, group_id: int, seq: int, ranks: list[int]) -> str:
        try:
            self._publish()
            raw = self._store.multi_get([f"progress/{r}" for r in ranks]) if ranks else []
        except Exception as error:  # noqa: BLE001 - the explanation is best effort
            return f"; which ranks never reached it is unknown: the store failed ({type(error).__name__}: {error})"
        behind, unheard, now = [], [], time.time()
        for rank, data in zip(ranks, raw):
            record = json.loads(data)
            entry = record.get(str(group_id))
            last = "no operation on this group yet" if entry is None else f"last started {entry[1]}, seq {entry[0]}"
            age = now - record.get("at", now)
            if age >= self.pace.stale:  # it may have moved on since: not claimed to be behind
                unheard.append(f"{rank} ({last}, {age:.1f} s ago)")
            elif entry is None or entry[0] < seq:
                behind.append(f"{rank} ({last})")
        text = f"; ranks that never reached it: {', '.join(behind)}" if behind else ""
        if unheard:
            text += f"; not heard from lately (cut off from the store, or stopped): {', '.join(unheard)}"
        return text or "; every rank had started it (one may be stuck inside it)"
