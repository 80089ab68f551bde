"""Worker processes: spawn one in its own process group, watch it exit, signal its group.

Each worker runs in a new session (``start_new_session``, as torchrun does), so its pid is
also its process-group id and signalling the group reaches the grandchildren it started.
Signals go to those group ids only, never to names. On Linux a worker also gets SIGKILL
when its agent dies (PR_SET_PDEATHSIG), so a killed launcher leaves no worker running.
A watcher thread per worker reaps it (no zombies) and posts
``("exit", local_rank, monotonic, wall)`` on the agent's event queue; the exit times tell
the agent which worker failed first.
"""
from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from queue import SimpleQueue
from typing import Any

from ..core import deadline as _deadline
from ..core.deadline import Deadline
from .failure import WorkerExit

#: Lines of each worker's stderr kept for the failure summary.
TAIL_LINES = 60


@dataclass
class Worker:
    """A started worker; ``stdout_fd``/``stderr_fd`` are the read ends of its pipes."""

    rank: int
    local_rank: int
    proc: subprocess.Popen[bytes]
    stdout_fd: int
    stderr_fd: int
    stderr_tail: collections.deque[bytes] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    exit: WorkerExit | None = None
    stopped: bool = False  # signalled by the launcher stopping the round while it ran

    def stop(self, sig: int) -> None:
        """Signal the worker's group to stop the round; remember it (its exit is then not a
        failure) unless the worker had already ended, reaped by its watcher or not: a worker
        killed a moment before (SIGKILL, OOM) failed on its own, not by the launcher's doing."""
        if self.proc.returncode is None:
            self.stopped = self.stopped or not self.ended()
            self.signal_group(sig)

    def ended(self) -> bool:
        """True when the worker process has exited, whether or not it was reaped yet."""
        return self.exit_status() is not None

    def exit_status(self) -> int | None:
        """The worker's exit code as Popen gives it (-N: killed by signal N) once it has ended,
        reaped or not (it is not reaped here: its watcher does that); None while it runs, and
        where ``os.waitid`` is missing until it is reaped."""
        if self.proc.returncode is not None:
            return self.proc.returncode
        waitid = getattr(os, "waitid", None)
        if waitid is None:
            return None
        try:
            seen = waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped by the watcher meanwhile: it sets the code at once
            return self.proc.wait()
        if seen is None:
            return None
        return seen.si_status if seen.si_code == os.CLD_EXITED else -seen.si_status

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal_group(self, sig: int) -> bool:
        """Send ``sig`` to the worker's process group; False if the group no longer exists."""
        try:
            os.killpg(self.proc.pid, sig)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:  # only members that are not ours (setuid): nothing we may do
            return False

    def group_alive(self) -> bool:
        """True while any process of the worker's group (the worker or a grandchild) runs.

        Zombies do not count: orphans are reaped by init, which may take its time. Without
        ``/proc`` this is "the group exists", zombies included.
        """
        if not os.path.isdir("/proc/self"):
            return self.signal_group(0)
        return any(pgrp == self.proc.pid and state != "Z" for state, pgrp in _proc_states())


def _proc_states() -> Iterator[tuple[str, int]]:
    """(state, process group) of every process, from ``/proc/<pid>/stat``."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        yield fields[0].decode(), int(fields[2])


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the agent dies (Linux; elsewhere nothing)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def spawn(command: list[str], env: dict[str, str], rank: int, local_rank: int) -> Worker:
    """Start one worker with its stdout and stderr on fresh pipes (OSError if it cannot start)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        proc = subprocess.Popen(command, env=env, stdout=out_w, stderr=err_w, start_new_session=True,
                                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    except BaseException:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    return Worker(rank, local_rank, proc, out_r, err_r)


def watch(worker: Worker, events: SimpleQueue[tuple[Any, ...]]) -> threading.Thread:
    """Reap ``worker`` in a thread and post ``("exit", local_rank, monotonic, wall)`` when it exits
    (monotonic: pydist's clock, which the agent's stop time is read on too)."""

    def wait() -> None:
        worker.proc.wait()
        events.put(("exit", worker.local_rank, _deadline.now(), time.time()))

    thread = threading.Thread(target=wait, name=f"pydist-run-watch-{worker.local_rank}", daemon=True)
    thread.start()
    return thread


def sweep_groups(workers: list[Worker], grace: float) -> None:
    """Stop processes left in the workers' groups after the workers exited (stray grandchildren):
    SIGTERM, then SIGKILL to the groups still present after ``grace`` seconds."""
    left = [w for w in workers if w.signal_group(signal.SIGTERM) and w.group_alive()]
    deadline = Deadline.after(grace)
    while left and not deadline.expired():
        _deadline.sleep(0.05)
        left = [w for w in left if w.group_alive()]
    for worker in left:
        worker.signal_group(signal.SIGKILL)
