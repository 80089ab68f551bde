"""How a worker ended, and the root-cause summary printed when a job fails.

The summary follows torchrun's ``ChildFailedError`` layout (title, other failures, root
cause = first observed failure) with the tail of the worker's stderr (normally its
Python traceback) in place of torchrun's error file. A worker killed by a signal shows
``exitcode: -N`` and the signal's name, as torchrun does.
"""
from __future__ import annotations

import datetime
import signal
import socket
from dataclasses import dataclass, field

_NO_TRACEBACK = " <N/A> (nothing on stderr)"


@dataclass
class WorkerExit:
    """A worker that has exited: ``returncode`` is Popen's (-N when killed by signal N)."""

    rank: int
    local_rank: int
    pid: int
    returncode: int
    wall_time: float
    monotonic_time: float
    stderr_tail: list[bytes] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    def signal_name(self) -> str | None:
        """The name of the signal that killed the worker, None if it exited by itself."""
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def describe(self) -> str:
        """``exit code 3`` or ``signal SIGKILL``, for one-line messages."""
        name = self.signal_name()
        return f"signal {name}" if name else f"exit code {self.returncode}"


def _format_failure(index: int, failure: WorkerExit) -> str:
    name = failure.signal_name()
    when = datetime.datetime.fromtimestamp(failure.wall_time).isoformat(sep="_", timespec="seconds")
    tail = b"".join(failure.stderr_tail).decode("utf-8", "replace").rstrip("\n")
    traceback = ("\n" + tail).replace("\n", "\n    ") if tail else _NO_TRACEBACK
    return (
        f"[{index}]:\n"
        f"  time      : {when}\n"
        f"  host      : {socket.getfqdn()}\n"
        f"  rank      : {failure.rank} (local_rank: {failure.local_rank})\n"
        f"  exitcode  : {failure.returncode} (pid: {failure.pid}){f' ({name})' if name else ''}\n"
        f"  traceback :{traceback}"
    )


def format_summary(
    entrypoint: str, root: WorkerExit, others: list[WorkerExit], stopped_ranks: list[int]
) -> str:
    """The root-cause report: ``root`` failed first, ``others`` failed on their own later
    (before the launcher stopped them), ``stopped_ranks`` were stopped by the launcher."""
    root_fmt = _format_failure(0, root)
    others_fmt = [_format_failure(i + 1, f) for i, f in enumerate(others)] or ["  <NO_OTHER_FAILURES>"]
    stopped = ", ".join(map(str, stopped_ranks)) if stopped_ranks else "none"
    title = f"{entrypoint} FAILED"
    width = min(60, max(len(line) for line in [title, *root_fmt.splitlines()]))
    return "\n".join(
        [
            "",
            "=" * width,
            title,
            "-" * width,
            "Failures:",
            *others_fmt,
            "-" * width,
            "Root Cause (first observed failure):",
            root_fmt,
            "-" * width,
            f"Stopped by the launcher (not failures): ranks {stopped}",
            "=" * width,
        ]
    )
