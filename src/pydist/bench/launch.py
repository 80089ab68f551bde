"""Start one backend's N workers, stream their events, and always clean them up by pid.

:func:`run_backend` is the whole life of one run: start the workers (N processes with
env:// variables, or one ``mpiexec -n N``), all writing event lines into one pipe and their
stderr into one temporary file; yield rank 0's ``start``/``row`` events; stop at ``done``.
It raises :class:`BackendFailed` when a rank reports an error, a process exits before
``done`` or the deadline passes — with the tail of the workers' stderr in the message. On
any exit (including KeyboardInterrupt) every process still running is terminated, then
killed: the processes it started, and the MPI ranks' reported pids if mpiexec had to be
stopped. :class:`Workers` (start processes) and :func:`stream` (their events until ``done``)
serve ``pydist-bench --scale`` too (see :mod:`.scale`).
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Generator, Iterable

from .backends import BackendSpec, mpiexec_path
from .worker import LAUNCHER_ENV, PREFIX

_GRACE = 3.0  # seconds between SIGTERM and SIGKILL, and for workers to exit after "done"


class BackendFailed(RuntimeError):
    """A backend's run did not complete; the message says why."""


def _free_port() -> int:
    from pydist.testing import free_port
    return free_port()


def _base_env(spec: BackendSpec, config: dict) -> dict[str, str]:
    """This environment, with OMP_NUM_THREADS=1 unless set (what torchrun and pydist-run do for
    several workers per host: each rank's math threads would otherwise fight over the cores),
    the launcher's pid for the workers' orphan watchdog, and for ``--transport tcp`` the
    backend's ``tcp_env``."""
    forced = dict(spec.tcp_env) if config.get("transport") == "tcp" else {}
    return {"OMP_NUM_THREADS": "1", **os.environ, **forced, LAUNCHER_ENV: str(os.getpid())}


def _commands(spec: BackendSpec, nproc: int, config: dict,
              extra: dict[str, str] | None = None) -> list[tuple[list[str], dict[str, str]]]:
    """Each process's argv and environment (``extra``: the backend's own variables)."""
    extra = extra or {}
    worker = [sys.executable, "-m", "pydist.bench.worker", spec.key, json.dumps(config)]
    if spec.launcher == "mpiexec":
        return [([mpiexec_path() or "mpiexec", "-n", str(nproc), *worker], {**_base_env(spec, config), **extra})]
    port = _free_port()
    return [(worker, {**_base_env(spec, config), **extra, **rank_env(rank, nproc, port)}) for rank in range(nproc)]


def rank_env(rank: int, nproc: int, port: int) -> dict[str, str]:
    """The env:// variables of rank ``rank`` of ``nproc`` on this host, the store at 127.0.0.1:``port``."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(nproc),
            "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(nproc)}


Command = tuple[list[str], dict[str, str]]


class Workers:
    """The started processes, the read end of their shared stdout pipe, their stderr file.
    ``commands``: each process's (argv, environment), taken one at a time just before that
    process starts (a generator may stamp the time into it); ``scratch``: a directory
    removed with the workers."""

    def __init__(self, commands: Iterable[Command], scratch: tempfile.TemporaryDirectory | None = None) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.scratch = scratch
        self.procs: list[subprocess.Popen] = []
        self.rank_pids: set[int] = set()
        read_fd, write_fd = os.pipe()
        self.read_fd, self.buffer = read_fd, b""
        try:
            for argv, env in commands:
                self.procs.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=write_fd,
                                                   stderr=self.stderr))
        except BaseException:
            os.close(write_fd)
            self.stop(gracefully=False)
            raise
        os.close(write_fd)

    def lines(self, timeout: float) -> list[str]:
        """Complete lines read within ``timeout`` seconds; raises EOFError once all writers closed."""
        ready, _, _ = select.select([self.read_fd], [], [], max(timeout, 0.0))
        if not ready:
            return []
        chunk = os.read(self.read_fd, 65536)
        if not chunk:
            raise EOFError
        self.buffer += chunk
        *complete, self.buffer = self.buffer.split(b"\n")
        return [line.decode(errors="replace") for line in complete]

    def failure(self, reason: str) -> BackendFailed:
        """``reason`` plus the exit codes and the last lines the workers wrote to stderr."""
        codes = ["running" if proc.poll() is None else proc.returncode for proc in self.procs]
        self.stderr.seek(0)
        tail = self.stderr.read().decode(errors="replace").strip().splitlines()[-15:]
        text = f"{reason} (worker processes: {', '.join(map(str, codes))})"
        return BackendFailed(text + ("\n  worker stderr:\n    " + "\n    ".join(tail) if tail else ""))

    def stop(self, gracefully: bool) -> None:
        """Wait for exit (``gracefully``) or terminate, then kill whatever still runs, by pid."""
        deadline = time.monotonic() + _GRACE
        if not gracefully:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                gracefully = False
        own = {proc.pid for proc in self.procs}
        for pid in self.rank_pids - own if not gracefully else ():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        os.close(self.read_fd)
        self.stderr.close()
        if self.scratch is not None:
            self.scratch.cleanup()


def _start(spec: BackendSpec, nproc: int, config: dict) -> Workers:
    """``spec``'s workers on ``config``, with their scratch directory if the backend needs one."""
    scratch = tempfile.TemporaryDirectory(prefix="pydist-bench-") if spec.extra_env else None
    try:
        extra = spec.extra_env(scratch.name) if spec.extra_env and scratch else {}
        commands = _commands(spec, nproc, config, extra)
    except BaseException:
        if scratch is not None:
            scratch.cleanup()
        raise
    return Workers(commands, scratch)


def run_backend(spec: BackendSpec, nproc: int, config: dict, timeout: float) -> Generator[dict, None, None]:
    """Run ``spec``'s workers on ``config``; yield rank 0's start/row events (see module note)."""
    yield from stream(_start(spec, nproc, config), timeout)


def stream(workers: Workers, timeout: float) -> Generator[dict, None, None]:
    """The workers' events other than ``pid``, until one says ``done``; raises BackendFailed on
    an ``error`` event, an early exit or ``timeout`` seconds; stops the workers on any exit."""
    deadline, done = time.monotonic() + timeout, False
    try:
        while not done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise workers.failure(f"timed out after {timeout:g} s")
            try:
                lines = workers.lines(min(remaining, 0.2))
            except EOFError:
                raise workers.failure("workers exited before finishing") from None
            if not lines and any(proc.poll() not in (None, 0) for proc in workers.procs):
                raise workers.failure("a worker process failed")
            for line in lines:
                if not line.startswith(PREFIX):
                    continue
                event = json.loads(line[len(PREFIX):])
                kind = event["event"]
                if kind == "pid":
                    workers.rank_pids.add(event["pid"])
                elif kind == "error":
                    raise workers.failure(f"rank {event['rank']} failed: {event['message']}")
                elif kind == "done":
                    done = True
                else:
                    yield event
    finally:
        workers.stop(gracefully=done)
