"""Where completion callbacks run: never on a progress or transport thread.

A callback may block on another operation of its own group (torch's PowerSGD hook waits,
inside a ``Future.then`` callback, on an all_reduce it has just issued). Run on the
group's progress thread, that all_reduce would queue behind the callback waiting for it.
torch avoids this by completing gloo's futures on worker threads separate from the
caller; pydist hands callbacks to this runner: tasks start in submission order, each on
an idle worker, or on a new worker when every worker is busy (so a callback blocked on a
later completion never holds that completion up). Workers ("pydist-callbacks") are
daemon threads that exit after ``IDLE_SECONDS`` without work, or at once when
``release_idle()`` is called (the test suite's leak guard does, instead of waiting).
At interpreter exit the runner waits (``EXIT_WAIT_SECONDS`` at most) for the tasks begun to
end: a daemon thread still inside torch's C++ code (a Future's ``set_result`` running its
``then`` callbacks) when Python finalises aborts the process ("terminate called without an
active exception", or "PyEval_SaveThread: ... GIL is released"). A forked child starts with
an empty runner: its parent's workers and their lock's holder do not exist in it, and the
tasks queued in the parent are the parent's to run.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from functools import partial

IDLE_SECONDS = 1.0  # short: an idle process keeps no threads; restarting one costs ~0.1 ms
EXIT_WAIT_SECONDS = 10.0  # a callback still blocked then is logged and left to the process's end

_log = logging.getLogger("pydist")


class CallbackRunner:
    """A FIFO of tasks served by as many workers as are needed to never wait for a busy one."""

    def __init__(self, idle_seconds: float = IDLE_SECONDS):
        self._idle_seconds = idle_seconds
        self._started = 0
        self._empty()
        os.register_at_fork(after_in_child=partial(_empty_in_child, weakref.ref(self)))

    def _empty(self) -> None:
        """No task, no worker (a new runner, or a forked child's copy)."""
        self._cond = threading.Condition(threading.Lock())
        self._tasks: deque[Callable[[], None]] = deque()
        self._idle = 0  # workers waiting for a task
        self._busy = 0  # workers running a task
        self._releases = 0  # bumped by release_idle: a worker idle since before it exits

    def release_idle(self) -> None:
        """Tell every worker idle now to exit at once instead of after ``idle_seconds``, and
        wake them. Busy workers finish their task first; a task queued meanwhile is still
        served (a woken worker takes it instead of exiting), and later tasks start new workers."""
        with self._cond:
            self._releases += 1
            self._cond.notify_all()

    def wait_until_done(self, timeout: float) -> bool:
        """Wait until no task is queued or running (``timeout`` seconds at most, real time:
        the process is ending); whether it got there."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._tasks and not self._busy, timeout)

    def _at_exit(self) -> None:
        if not self.wait_until_done(EXIT_WAIT_SECONDS):
            _log.warning("pydist: a completion callback was still running %.0f s into the interpreter's exit; "
                         "the process may abort if it is inside torch's C++ code", EXIT_WAIT_SECONDS)

    def run(self, task: Callable[[], None]) -> None:
        """Start ``task()`` soon on a worker thread; its exceptions are logged, not raised."""
        with self._cond:
            self._tasks.append(task)
            if self._idle >= len(self._tasks):  # every queued task has an idle worker to take it
                self._cond.notify()
                return
            self._started += 1
            number = self._started
        threading.Thread(target=self._serve, name=f"pydist-callbacks-{number}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                releases = self._releases
                while not self._tasks:
                    # real time: an idle worker's lifetime, not a timeout anyone waits for
                    timed_out = not self._cond.wait(self._idle_seconds)
                    if not self._tasks and (timed_out or self._releases != releases):
                        self._idle -= 1
                        return
                self._idle -= 1
                self._busy += 1
                task = self._tasks.popleft()
            try:
                task()
            except BaseException:  # noqa: BLE001 - a callback's failure must not kill the worker
                _log.exception("pydist: a completion callback raised")
            with self._cond:
                self._busy -= 1
                if not self._busy and not self._tasks:
                    self._cond.notify_all()  # wait_until_done; idle workers see no task and wait on


def _empty_in_child(runner: weakref.ref[CallbackRunner]) -> None:
    alive = runner()
    if alive is not None:
        alive._empty()


RUNNER = CallbackRunner()
atexit.register(RUNNER._at_exit)
