"""One rank of a benchmark run: ``python -m pydist.bench.worker BACKEND CONFIG_JSON``.

Started by :mod:`.launch` (as N processes, or under mpiexec). It joins its backend's group,
runs :func:`.timing.run_plan`, and writes events as single-line JSON to stdout, each line
prefixed with :data:`PREFIX` and written with one ``write`` so lines of several ranks sharing
the pipe never interleave: every rank reports ``pid`` (for cleanup) and, on failure,
``error``; rank 0 reports ``start``/``row`` per size and ``done``. A watchdog thread exits
the process if its parent or the launcher dies, so a killed launcher leaves no orphans.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback

from ..core.settings import settings
from ..core.shm_files import pid_alive

PREFIX = "@@pydist-bench "
LAUNCHER_ENV = "PYDIST_BENCH_LAUNCHER_PID"
_MAX_MESSAGE = 1500  # keeps an error line below PIPE_BUF, so its write stays atomic


def emit(event: dict) -> None:
    """Write one event line to stdout in a single write."""
    os.write(1, (PREFIX + json.dumps(event) + "\n").encode())




def exit_when_orphaned(interval: float = 0.5) -> None:
    """Exit (status 3) once the parent process or the launcher (``$LAUNCHER_ENV``: the CLI,
    which is not the parent under mpiexec) is gone."""
    parent = os.getppid()
    launcher = settings().bench_launcher_pid or 0

    def watch() -> None:
        while os.getppid() == parent and not (launcher and not pid_alive(launcher)):
            time.sleep(interval)
        os._exit(3)

    threading.Thread(target=watch, name="bench-orphan-watchdog", daemon=True).start()


def report_failure(rank: object, error: BaseException) -> None:
    """Print the traceback to stderr and send the launcher an ``error`` event."""
    traceback.print_exc()
    emit({"event": "error", "rank": rank, "message": f"{type(error).__name__}: {error}"[:_MAX_MESSAGE]})


def main(argv: list[str]) -> int:
    from .backends import BACKENDS
    from .timing import run_plan
    name, config = argv[0], json.loads(argv[1])
    exit_when_orphaned()
    rank = os.environ.get("RANK") or os.environ.get("PMI_RANK") or "?"  # until the group says
    try:
        comm = BACKENDS[name].connect(config["timeout"])
        rank = comm.rank
        emit({"event": "pid", "rank": rank, "pid": os.getpid()})
        run_plan(comm, config, emit if rank == 0 else None)
        if rank == 0:
            emit({"event": "done"})
        comm.close()
    except BaseException as error:  # noqa: BLE001 - reported to the launcher, then exit 1
        report_failure(rank, error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
