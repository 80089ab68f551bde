"""How a worker ended, and the root-cause summary printed when a job fails.

The summary follows torchrun's ``ChildFailedError`` layout (title, other failures, root
cause = first observed failure). A worker's exception (type, message, traceback) comes
from its error file (written by torch's ``@record`` or pydist-run's sitecustomize), else
the tail of its stderr stands in. A worker killed by a signal shows ``exitcode: -N`` and
the signal's name, as torchrun does. A WorkerExit travels between hosts' agents as JSON
(:meth:`WorkerExit.to_json` / :meth:`WorkerExit.from_json`).

One decision names the root cause (:func:`choose_root`), made once, when the launcher stops
the round: among the failures known then — the worker whose exit started the stop, the
workers that had exited too, and those that had recorded an exception but were still
exiting — the earliest by its own recorded time, never an echo (a recorded PeerFailedError
or GroupAbortedError: the rank failed because another one had) while a failure that is not
an echo is known, e.g. a rank killed by SIGKILL, the OOM killer or a segfault, which records
nothing (its time is when it was seen to end). The launcher's one-line message, the summary's
root cause and its lists all come from that decision (:func:`classify_exits`). A worker the
launcher signalled while it still ran (``stopped``) is *stopped by the launcher*, not a
failure, whatever it recorded; the other failures are the workers that exited with an error
on their own, before the launcher signalled them (one that had already ended when the signal
came, reaped or not, counts as failed on its own; see :meth:`.workers.Worker.stop`).
"""
from __future__ import annotations

import datetime
import json
import signal
from dataclasses import asdict, dataclass
from typing import Any

_NO_TRACEBACK = " <N/A> (nothing on stderr)"

#: Exception types whose record marks an echo: the worker failed because another rank had.
ECHO_ERRORS = ("PeerFailedError", "GroupAbortedError")


@dataclass
class WorkerExit:
    """A worker that has exited: ``returncode`` is Popen's (-N when killed by signal N)."""

    rank: int
    local_rank: int
    pid: int
    returncode: int | None  # None: it had recorded its failure and not exited yet when named
    wall_time: float
    monotonic_time: float
    host: str = ""
    error: str = ""  # "Type: message" of the uncaught exception, if recorded
    traceback: str = ""  # its traceback, else the tail of stderr
    recorded_at: float = 0.0  # wall time the worker recorded its failure (error file), 0 if none
    stopped: bool = False  # the launcher signalled the worker (stopping the round) before it was reaped
    configuration: bool = False  # its error is in the job's configuration (pydist's ConfigurationError)

    @property
    def failed_at(self) -> float:
        """When the worker failed, by its own clock: the recorded time, else its exit."""
        return self.recorded_at or self.wall_time

    @property
    def failed(self) -> bool:
        return self.returncode != 0

    def same_worker(self, other: WorkerExit) -> bool:
        return (self.host, self.rank) == (other.host, other.rank)

    @property
    def echo(self) -> bool:
        """True when the recorded exception is an echo of another rank's failure
        (:data:`ECHO_ERRORS`, by its type's name, module-qualified or not)."""
        kind = self.error.split(":", 1)[0].rsplit(".", 1)[-1] if self.recorded_at else ""
        return kind in ECHO_ERRORS

    def signal_name(self) -> str | None:
        """The name of the signal that killed the worker, None if it exited by itself."""
        if self.returncode is None or self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def describe(self) -> str:
        """``exit code 1 (ValueError: boom)`` or ``signal SIGKILL``, for one-line messages."""
        if self.returncode is None:
            return f"{self.error} (recorded; it had not exited yet)"
        name = self.signal_name()
        how = f"signal {name}" if name else f"exit code {self.returncode}"
        return f"{how} ({self.error})" if self.error else how

    def add_output(self, error_file: str | None, stderr_tail: list[bytes]) -> None:
        """Fill in the exception from ``error_file`` (torch's @record format) if it exists,
        else the stderr tail as the traceback."""
        try:
            with open(error_file or "", encoding="utf-8") as f:
                message = json.load(f)["message"]
            self.error = str(message["message"])
            extra = message.get("extraInfo", {})
            self.traceback = str(extra.get("py_callstack", ""))
            self.recorded_at = float(extra.get("pydist_wall_time") or extra.get("timestamp") or 0.0)
            self.configuration = extra.get("pydist_configuration") is True
        except (OSError, ValueError, KeyError, TypeError):
            self.traceback = b"".join(stderr_tail).decode("utf-8", "replace")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerExit:
        return cls(**data)


def choose_root(failures: list[WorkerExit]) -> WorkerExit:
    """The root cause among ``failures`` (not empty): the earliest by its own clock, never an
    echo while a failure that is not an echo is among them (see the module docstring)."""
    causes = [e for e in failures if not e.echo] or failures
    return min(causes, key=lambda e: e.failed_at)


def classify_exits(
    root: WorkerExit, exits: list[WorkerExit]
) -> tuple[WorkerExit, list[WorkerExit], list[int]]:
    """(root cause, other failures by time, ranks stopped by the launcher) of a failed round
    whose root cause was decided to be ``root`` (from any node); ``exits`` are this node's
    reaped workers. The root cause is returned as it ended here when it was this node's (its
    final exit code); every rank of ``exits`` lands in at most one of the three, so the
    report's list and its footer agree."""
    root = next((e for e in exits if e.same_worker(root)), root)
    others = sorted((e for e in exits if e.failed and not e.stopped and not e.same_worker(root)),
                    key=lambda e: e.failed_at)
    stopped = sorted(e.rank for e in exits if e.stopped and not e.same_worker(root))
    return root, others, stopped


def _exit_code(failure: WorkerExit) -> str:
    return "none yet (still exiting when the launcher stopped the round)" if failure.returncode is None \
        else str(failure.returncode)


def _format_failure(index: int, failure: WorkerExit) -> str:
    name = failure.signal_name()
    when = datetime.datetime.fromtimestamp(failure.wall_time).isoformat(sep="_", timespec="seconds")
    tail = failure.traceback.rstrip("\n")
    traceback = ("\n" + tail).replace("\n", "\n    ") if tail else _NO_TRACEBACK
    return (
        f"[{index}]:\n"
        f"  time      : {when}\n"
        f"  host      : {failure.host}\n"
        f"  rank      : {failure.rank} (local_rank: {failure.local_rank})\n"
        f"  exitcode  : {_exit_code(failure)} (pid: {failure.pid}){f' ({name})' if name else ''}\n"
        + (f"  error     : {failure.error}\n" if failure.error else "") +
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


def format_configuration_error(entrypoint: str, root: WorkerExit, others: list[WorkerExit]) -> str:
    """One paragraph for a round stopped by an error in the job's configuration (a
    ConfigurationError: the same on every rank, fixed outside the code): the error once and
    the ranks that failed with it, no traceback."""
    ranks = sorted({root.rank, *(e.rank for e in others if e.error == root.error)})
    listing = f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} on {root.host}"
    return (f"{entrypoint} FAILED: the job's configuration is wrong ({listing}):\n"
            f"  {root.error}\n"
            "  Fix it and start the job again (no traceback: the error is in the configuration, not the code).")
