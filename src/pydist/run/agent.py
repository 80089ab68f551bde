"""The local agent: host the job's store, start this node's workers, watch them, stop them.

:meth:`LocalAgent.run` returns the launcher's exit code:

- 0 when every worker exited with 0.
- 1 when a worker failed (non-zero exit or killed by a signal) -- torchrun's code, since its
  ``ChildFailedError`` escapes ``main``. The agent then sends SIGTERM to the other workers'
  process groups, SIGKILL after ``shutdown_timeout`` seconds, and prints a root-cause summary
  (first failed rank, its pid, exit code or signal, the tail of its stderr) to stderr. Ranks
  that exited because the agent stopped them are not failures.
- 128 + N when the launcher itself got signal N (SIGINT, SIGTERM, SIGHUP, SIGQUIT, the signals
  torchrun handles): the signal is forwarded to every worker group, with SIGKILL after the
  grace period. torchrun exits 1 here (its ``SignalException`` escapes ``main``); the shell's
  128+N convention tells the caller what happened. A second signal skips the grace period.
- 1 when the store or a worker cannot be started.

Whatever happens, when ``run`` returns no worker or grandchild in the workers' process groups
is left, every worker is reaped, the pipes are closed, the store is closed and the previous
signal handlers are back.
"""
from __future__ import annotations

import signal
import sys
import threading
import time
from queue import Empty, SimpleQueue
from types import FrameType
from typing import TYPE_CHECKING, Any, BinaryIO

from .config import OMP_NOTE, LaunchConfig, worker_env
from .failure import WorkerExit, format_summary
from .output import OutputPump, write_bytes
from .workers import Worker, spawn, sweep_groups, watch

if TYPE_CHECKING:
    from pydist.store import TCPStore

#: Signals the launcher catches and forwards to the workers (torchrun's --signals-to-handle default).
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
EXIT_WORKER_FAILED = 1
#: Seconds to wait for pipes still held open by stray grandchildren after the workers exited.
PIPE_DRAIN_TIMEOUT = 2.0


def start_store(host: str, port: int) -> TCPStore:
    """Start the job's TCPStore server on ``host:port`` (0: a free port, read back from ``.port``)."""
    from pydist.store import TCPStore  # lazily: the store package is not needed to parse arguments

    return TCPStore(host, port, world_size=None, is_master=True, wait_for_workers=False)


class LocalAgent:
    """Runs one node's worker group to completion; see the module docstring for exit codes."""

    def __init__(self, config: LaunchConfig, stdout: BinaryIO | None = None, stderr: BinaryIO | None = None):
        self.config = config
        self._stdout = stdout if stdout is not None else sys.stdout.buffer
        self._stderr = stderr if stderr is not None else sys.stderr.buffer
        self._events: SimpleQueue[tuple[Any, ...]] = SimpleQueue()
        self.workers: list[Worker] = []
        self.master_port: int | None = None
        self._stopping_since: float | None = None

    def _say(self, text: str) -> None:
        write_bytes(self._stderr, f"pydist-run: {text}\n".encode("utf-8", "replace"))

    def run(self) -> int:
        """Launch the workers, wait for them, clean up; return the launcher's exit code."""
        previous = self._install_signal_handlers()
        store = None
        try:
            try:
                store = start_store(self.config.master_addr, self.config.master_port)
                self.master_port = store.port
            except (OSError, RuntimeError) as exc:  # RuntimeError: pydist's DistStoreError & co.
                self._say(f"cannot start the store on {self.config.master_addr}:{self.config.master_port}: {exc}")
                return EXIT_WORKER_FAILED
            if self.config.sets_omp_num_threads():
                write_bytes(self._stderr, (OMP_NOTE + "\n").encode())
            return self._run_workers(self.master_port)
        finally:
            if store is not None:
                store.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run_workers(self, master_port: int) -> int:
        pump = OutputPump()
        code = 0
        try:
            try:
                self._spawn_all(master_port, pump)
            except OSError as exc:
                self._say(f"cannot start worker {len(self.workers)} ({' '.join(self.config.command)}): {exc}")
                code = EXIT_WORKER_FAILED
                self._stop(signal.SIGTERM)
            pump.start()
            code = self._monitor() or code
        finally:
            for worker in self.workers:  # only reached with live workers if the agent itself broke
                if worker.proc.returncode is None:
                    worker.signal_group(signal.SIGKILL)
                    worker.proc.wait()
            sweep_groups(self.workers, self.config.shutdown_timeout)
            if not pump.wait(PIPE_DRAIN_TIMEOUT):
                pump.stop()
        if code == EXIT_WORKER_FAILED:
            self._report_failures()
        return code

    def _spawn_all(self, master_port: int, pump: OutputPump) -> None:
        for local_rank in range(self.config.nproc_per_node):
            rank = self.config.global_rank(local_rank)
            env = worker_env(self.config, local_rank, master_port)
            worker = spawn(self.config.command, env, rank, local_rank)
            self.workers.append(worker)
            pump.add(worker.stdout_fd, f"[rank{rank}]:", self._stdout)
            pump.add(worker.stderr_fd, f"[rank{rank}]:", self._stderr, worker.stderr_tail)
            watch(worker, self._events)

    def _monitor(self) -> int:
        """Handle exits and signals until every worker is reaped; return the exit code."""
        alive = {w.local_rank for w in self.workers}
        code = 0
        killed = hurry = False
        while alive:
            kill_at = None if self._stopping_since is None else self._stopping_since + self.config.shutdown_timeout
            timeout = 1.0 if kill_at is None or killed else max(0.0, kill_at - time.monotonic())
            try:
                event = self._events.get(timeout=timeout)
            except Empty:
                event = ("tick",)
            if event[0] == "exit":
                _, local_rank, mono, wall = event
                alive.discard(local_rank)
                worker = self.workers[local_rank]
                worker.exit = WorkerExit(worker.rank, local_rank, worker.pid, worker.proc.returncode, wall, mono)
                if worker.exit.failed and self._stopping_since is None:
                    self._say(f"rank {worker.rank} (pid {worker.pid}) failed with {worker.exit.describe()}; "
                              "stopping the other workers")
                    code = EXIT_WORKER_FAILED
                    self._stop(signal.SIGTERM)
            elif event[0] == "signal" and self._stopping_since is None:
                self._say(f"got {signal.Signals(event[1]).name}; stopping the workers")
                code = 128 + event[1]
                self._stop(event[1])
            elif event[0] == "signal":
                hurry = True  # a second signal: no more grace
            if self._stopping_since is not None and not killed and alive:
                if hurry or time.monotonic() >= self._stopping_since + self.config.shutdown_timeout:
                    for worker in self.workers:
                        if worker.local_rank in alive:
                            worker.signal_group(signal.SIGKILL)
                    killed = True
        return code

    def _stop(self, sig: int) -> None:
        """Start stopping: send ``sig`` to every worker group that has not exited yet."""
        self._stopping_since = time.monotonic()
        for worker in self.workers:
            if worker.proc.returncode is None:
                worker.signal_group(sig)

    def _report_failures(self) -> None:
        """Print the root-cause summary: failures that happened before the agent began stopping."""
        stop = self._stopping_since if self._stopping_since is not None else float("inf")
        exits = [w.exit for w in self.workers if w.exit is not None]
        failures = sorted((e for e in exits if e.failed and e.monotonic_time <= stop), key=lambda e: e.monotonic_time)
        if not failures:
            return
        for failure in failures:
            failure.stderr_tail = list(self.workers[failure.local_rank].stderr_tail)
        stopped = sorted(e.rank for e in exits if e.monotonic_time > stop)
        name = self.config.entrypoint or self.config.command[0]
        write_bytes(self._stderr, (format_summary(name, failures[0], failures[1:], stopped) + "\n").encode())

    def _install_signal_handlers(self) -> dict[int, Any]:
        """Catch :data:`HANDLED_SIGNALS` (main thread only); return the handlers replaced."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self._events.put(("signal", signum))  # SimpleQueue.put is safe in a signal handler

        return {sig: signal.signal(sig, on_signal) for sig in HANDLED_SIGNALS}
