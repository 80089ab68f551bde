"""The watchdog of a group's device work: nothing waits forever on a device event.

Behaviour
    A device call returns once its work is enqueued (NCCL's way), so a peer that dies or
    hangs after that would leave the work waiting on its events with nobody to notice. The
    engine ``track``s each call's end event with its description and deadline; a daemon thread
    (``pydist-device-watchdog``, running while calls are outstanding) polls them every POLL_S.
    A complete call is dropped. A call whose work waits on a process that died (the exporter
    of an event it waits on) fails with PeerFailedError naming that rank; a call not complete
    by its deadline with OpTimeoutError naming it. The first failure becomes ``failure``: the
    group's next device call raises it (the group's failure path then breaks the group), and
    so does the Work of that call. On a strict device (the stand-in runs work only when
    something waits for it) the thread checks for dead peers only, and never runs work: a
    deadline there would fire on work nobody has asked for yet.

Cost
    One event query per outstanding call and poll (CUDA: cudaEventQuery, ~1 µs) and a liveness
    check per peer it waits on (a kill(pid, 0)).
"""
from __future__ import annotations

import logging
import threading

from ..core import deadline as _deadline
from ..core.deadline import Deadline
from ..core.errors import OpTimeoutError
from ..core.shm_files import pid_alive
from ..device.events import Event, peer_died

POLL_S = 0.05
_log = logging.getLogger("pydist")


class Watchdog:
    """The outstanding device calls of one group on one rank (module docstring)."""

    def __init__(self, where: str, strict: bool):
        self.where = where
        self.strict = strict
        self.failure: BaseException | None = None
        self._calls: list[tuple[Event, str, Deadline]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False

    def track(self, event: Event, what: str, deadline: Deadline) -> None:
        """Watch ``event`` (recorded after the call's work) until complete or failed."""
        with self._lock:
            if self._closed:
                return
            self._calls.append((event, what, deadline))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pydist-device-watchdog", daemon=True)
                self._thread.start()

    def outstanding(self) -> list[Event]:
        """The end events of the calls not yet seen complete."""
        with self._lock:
            return [event for event, _, _ in self._calls]

    def _run(self) -> None:
        while not self._wake.wait(POLL_S):
            with self._lock:
                calls = list(self._calls)
            left = [call for call in calls if not self._settled(*call)]
            with self._lock:
                self._calls = [call for call in self._calls if call not in calls or call in left]
                if not self._calls or self._closed:
                    self._thread = None
                    return

    def _settled(self, event: Event, what: str, deadline: Deadline) -> bool:
        """Whether the call needs no more watching: complete, or failed (``failure`` set)."""
        try:
            if self.strict:
                blocker = None if event.ran() else event.dead_peer()
                if blocker is None:
                    return event.ran()
            else:
                blocker = event.blocker()
                if blocker is None:
                    return True
        except Exception as error:  # noqa: BLE001 - a device error is the call's failure
            return self._fail(error)
        source, description = blocker
        if source is not None and not pid_alive(source.pid):
            return self._fail(peer_died(source, self.where, what))
        if not self.strict and deadline.at is not None and _deadline.now() >= deadline.at:
            return self._fail(OpTimeoutError(f"{self.where}: {what} not complete on the device by its deadline "
                                             f"(waiting for {description})"))
        return False

    def _fail(self, error: BaseException) -> bool:
        if self.failure is None:
            self.failure = error
            _log.error("pydist: %s", error)
        return True

    def close(self) -> None:
        """Stop watching (the thread ends at its next poll)."""
        with self._lock:
            self._closed = True
            self._calls = []
        self._wake.set()
