"""Which operation each rank last started, published through the store, so that a timeout
can name the ranks that never reached the operation.

Each rank's :class:`ProgressBoard` records (sequence number, name) of the latest operation it
started on each group — a dict assignment per operation — and a ``pydist-progress``
thread writes the record to the store key ``progress/<rank>`` at most once a second,
only when it changed. At a timeout, :meth:`ProgressBoard.explain` reads every member's record
(at most ~1 s old) and names those behind.
"""
from __future__ import annotations

import json
import threading

#: Seconds between publications (when something changed).
PUBLISH_INTERVAL = 1.0
#: Seconds a timed-out operation spends at most asking the store which ranks are behind
#: (10 % of the timeout when that is less), so the error comes at the deadline.
EXPLAIN_BUDGET = 2.0


class ProgressBoard:
    """This rank's latest operation per group, and the other ranks' as published."""

    def __init__(self, store, rank: int):
        self._store = store
        self._rank = rank
        self._latest: dict[str, tuple[int, str]] = {}
        self._changed = False
        self._stop = threading.Event()
        self._publish()  # the key exists from the start: readers never block on it
        self._thread = threading.Thread(target=self._run, name=f"pydist-progress-{rank}", daemon=True)
        self._thread.start()

    def started(self, group_id: int, seq: int, name: str) -> None:
        """This rank starts operation ``seq`` (``name``) of group ``group_id``."""
        self._latest[str(group_id)] = (seq, name)
        self._changed = True

    def _publish(self) -> None:
        self._changed = False
        self._store.set(f"progress/{self._rank}", json.dumps(self._latest))

    def _run(self) -> None:
        while not self._stop.wait(PUBLISH_INTERVAL):
            if self._changed:
                try:
                    self._publish()
                except Exception:  # the store is gone (shutdown, failure): the op errors say why
                    return

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def explain(self, group_id: int, seq: int, ranks: list[int], budget: float = EXPLAIN_BUDGET) -> str:
        """Which of ``ranks`` (world ranks) had not started operation ``seq`` of the group,
        as last published; a note instead when the store does not answer within ``budget``
        seconds (its host stopped or unreachable: the timeout error must not wait for the
        store's own timeout); "" if the store failed."""
        answer: list[str] = []
        asking = threading.Thread(target=lambda: answer.append(self._ask(group_id, seq, ranks)),
                                  name=f"pydist-explain-{self._rank}", daemon=True)
        asking.start()
        asking.join(budget)
        if not answer:
            return f"; which ranks never reached it is unknown: the store did not answer within {budget:g} s"
        return answer[0]

    def _ask(self, group_id: int, seq: int, ranks: list[int]) -> str:
        try:
            self._publish()
            raw = self._store.multi_get([f"progress/{r}" for r in ranks]) if ranks else []
        except Exception:  # noqa: BLE001 - the explanation is best effort
            return ""
        behind = []
        for rank, data in zip(ranks, raw):
            entry = json.loads(data).get(str(group_id))
            if entry is None:
                behind.append(f"{rank} (no operation on this group yet)")
            elif entry[0] < seq:
                behind.append(f"{rank} (last started {entry[1]}, seq {entry[0]})")
        if not behind:
            return "; every rank had started it (one may be stuck inside it)"
        return f"; ranks that never reached it: {', '.join(behind)}"
