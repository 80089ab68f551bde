"""The thread that runs this process's stand-in work when a peer waits for it.

While this process has interprocess events (exported or not), a daemon thread
(``pydist-device-standin``) receives the peers' nudges (pydist.device.standin.nudges) and runs
the work before the asked-for records, without blocking (what waits on yet another peer is
asked for by the next nudge). The thread ends when the last such event goes; a forked child
starts with none.
"""
from __future__ import annotations

import os
import socket
import threading

from . import nudges
from .scheduler import SCHEDULER, Epochs

_POLL_S = 0.2  # how soon the thread sees that it should end
_JOIN_S = 1.0


class Executor:
    """This process's events that peers may wait on, and the thread serving them."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Nothing exported, no thread (a forked child)."""
        self.exported: dict[str, Epochs] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def export(self, epochs: Epochs) -> None:
        """Serve nudges for ``epochs`` (an interprocess event's records) from now on."""
        assert epochs.counters is not None
        with SCHEDULER.lock:
            self.exported[epochs.counters.name] = epochs
            if self._thread is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sock.bind(nudges.address(os.getpid()))
                sock.settimeout(_POLL_S)
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._serve, args=(sock, self._stop),
                                                name="pydist-device-standin", daemon=True)
                self._thread.start()

    def withdraw(self, epochs: Epochs) -> None:
        """``epochs``'s event is gone: remove its counters; the last one ends the thread."""
        assert epochs.counters is not None
        with SCHEDULER.lock:
            self.exported.pop(epochs.counters.name, None)
            epochs.counters.close()
            thread, stop = self._thread, self._stop
            if self.exported or thread is None:
                return
            self._thread = None
        stop.set()
        nudges.wake(os.getpid())
        if thread is not threading.current_thread():
            thread.join(_JOIN_S)  # bounded: a collection may run this where the lock is held

    def _serve(self, sock: socket.socket, stop: threading.Event) -> None:
        with sock:
            while not stop.is_set():
                try:
                    data = sock.recv(256)
                except TimeoutError:
                    continue
                asked = nudges.parse(data)
                epochs = self.exported.get(asked[0]) if asked else None
                if asked is None or epochs is None:
                    continue
                try:
                    SCHEDULER.serve(epochs, asked[1])
                except Exception:  # noqa: BLE001 - the work keeps failing for this process's own waits
                    continue


EXECUTOR = Executor()
os.register_at_fork(after_in_child=EXECUTOR.reset)
