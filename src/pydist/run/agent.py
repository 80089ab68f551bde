"""The agent: one per node. Opens the job's store, meets the other agents in rounds, runs
this node's workers for each round, and restarts them when the job must.

:meth:`Agent.run` returns the launcher's exit code:

- 0 when every worker of every node exited with 0.
- 1 when a worker failed (non-zero exit or killed by a signal) and no restart is left
  (``--max-restarts`` counts failure restarts for the whole job, not per node). Every
  agent stops its workers (SIGTERM, SIGKILL after ``shutdown_timeout``) and prints the
  root-cause summary: the first failure, on whichever node it happened, with its rank,
  host, exit code or signal, and exception and traceback. Ranks stopped by the launcher
  are not failures. With restarts left, the agents meet in a new round instead.
- 128 + N when a launcher got signal N (SIGINT, SIGTERM, SIGHUP, SIGQUIT): every agent
  stops its workers the same way and exits with that code. A second signal skips the
  grace period.
- 1 when the store, the rendezvous or a worker cannot be started.

Each round's workers get a store of their own (:mod:`.worker_store`) at MASTER_ADDR:MASTER_PORT,
so a restarted round never reads what the failed one left there. Both stores require the
job's secret (:mod:`.secret`: PYDIST_AUTH_TOKEN, else a random one for a single-node job),
which the workers get in their environment.

A node that arrives while a round runs (``--nnodes MIN:MAX`` with room left) makes the
round stop and a new one begin, without using a restart. Whatever happens, when ``run``
returns no worker or grandchild is left, pipes and log files are closed, a temporary log
directory is removed, the store is closed and the previous signal handlers are back.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import uuid
from queue import SimpleQueue
from types import FrameType
from typing import Any, BinaryIO

from .agent_rendezvous import (
    Interrupted,
    NodeRecord,
    Rendezvous,
    RendezvousError,
    RendezvousSettings,
    Round,
)
from .config import OMP_NOTE, LaunchConfig, Placement
from .endpoint import EndpointError, open_store
from .logs import LogDirs
from .output import write_bytes
from .round_run import RoundRun
from .secret import job_secret
from .worker_store import WorkerStore

#: Signals the launcher catches and forwards to the workers (torchrun's --signals-to-handle default).
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
EXIT_WORKER_FAILED = 1
#: Seconds the agent hosting the store waits for the others to read the outcome.
LEAVE_TIMEOUT = 10.0


class Agent:
    """Runs one node's share of a job to completion; see the module docstring."""

    def __init__(self, config: LaunchConfig, stdout: BinaryIO | None = None, stderr: BinaryIO | None = None):
        self.config = config
        self._stdout = stdout if stdout is not None else sys.stdout.buffer
        self._stderr = stderr if stderr is not None else sys.stderr.buffer
        self._events: SimpleQueue[tuple[Any, ...]] = SimpleQueue()
        self._signals: list[int] = []
        self.master_port: int | None = None
        self.auth_token: str | None = None  # the job's secret (see .secret); never printed

    def _say(self, text: str) -> None:
        write_bytes(self._stderr, f"pydist-run: {text}\n".encode("utf-8", "replace"))

    def run(self) -> int:
        """Meet the other agents, run the workers round after round; the exit code."""
        previous = self._install_signal_handlers()
        logs = LogDirs(self.config.logs, self.config.run_id)
        store = None
        try:
            self.auth_token, note = job_secret(self.config)
            if note is not None:
                self._say(note)
            try:
                store, hosting = open_store(self.config, self.auth_token)
            except EndpointError as exc:
                self._say(str(exc))
                return EXIT_WORKER_FAILED
            self.master_port = store.port
            if self.config.sets_omp_num_threads():
                write_bytes(self._stderr, (OMP_NOTE + "\n").encode())
            return self._rounds(self._rendezvous(store), hosting, logs)
        finally:
            if store is not None:
                store.close()
            logs.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _rendezvous(self, store: Any) -> Rendezvous:
        config = self.config
        settings = RendezvousSettings(config.run_id, config.min_nodes, config.max_nodes, config.join_timeout,
                                      config.last_call_timeout, config.static)
        host = socket.gethostname()
        me = NodeRecord(f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}", host,
                        config.local_addr or store.client_address(), config.nproc_per_node, config.node_rank)
        return Rendezvous(store, settings, me, interrupted=lambda: bool(self._signals))

    def _rounds(self, rdzv: Rendezvous, hosting: bool, logs: LogDirs) -> int:
        while True:
            try:
                round_ = rdzv.join()
                self._announce(rdzv, round_)
                workers_store = WorkerStore(rdzv, round_, self.config.master_addr if hosting else rdzv.me.addr,
                                            self.config.connect_timeout, self.auth_token or "")
            except Interrupted:
                self._say(f"got {signal.Signals(self._signals[0]).name} while waiting for the other nodes")
                return 128 + self._signals[0]
            except RendezvousError as exc:
                self._say(str(exc))
                if hosting and exc.round_number is not None:
                    rdzv.wait_left(exc.round_number, exc.members, LEAVE_TIMEOUT)
                return EXIT_WORKER_FAILED
            except (OSError, RuntimeError) as exc:  # the store went away
                self._say(f"lost the job's store at {self.config.master_addr}:{self.master_port}: {exc}")
                return EXIT_WORKER_FAILED
            try:
                address = workers_store.address
                placement = Placement(round_.node_rank, round_.nnodes, round_.number, address.addr, address.port)
                outcome = RoundRun(self, rdzv, round_, placement, logs).run()
            finally:
                workers_store.close()
            code = self._verdict(outcome)
            if code is not None:
                self._leave(rdzv, round_, hosting)
                return code

    def _announce(self, rdzv: Rendezvous, round_: Round) -> None:
        if round_.nnodes > 1 or round_.number > 0:
            first = round_.node_rank * round_.nproc
            self._say(f"round {round_.number}: node {round_.node_rank} of {round_.nnodes} "
                      f"({rdzv.me.where()}), ranks {first}..{first + round_.nproc - 1} of {round_.world_size}")

    def _verdict(self, outcome: dict[str, Any]) -> int | None:
        """The exit code for a round's outcome, or None to meet in a new round."""
        reason = outcome.get("reason")
        if reason == "done":
            return 0
        if reason == "signal":
            if outcome.get("host") != self._where():
                name = signal.Signals(outcome["signal"]).name
                self._say(f"the launcher on {outcome.get('host')} got {name}; stopped")
            return 128 + int(outcome["signal"])
        if reason == "store":
            self._say(outcome["message"])
            return EXIT_WORKER_FAILED
        if reason == "join":
            self._say(f"{outcome.get('host')} joins the job: starting a new round")
            return None
        used, allowed = int(outcome["restarts_used"]), self.config.max_restarts
        if used < allowed:
            self._say(f"restarting the job ({used + 1} of {allowed} restarts)")
            return None
        if allowed:
            self._say(f"no restarts left (--max-restarts {allowed})")
        return EXIT_WORKER_FAILED

    def _leave(self, rdzv: Rendezvous, round_: Round, hosting: bool) -> None:
        try:
            rdzv.leave(round_.number)
            if hosting:
                rdzv.wait_left(round_.number, round_.nnodes, LEAVE_TIMEOUT)
        except (OSError, RuntimeError):
            pass  # the store is gone: nobody is left to wait for

    def _where(self) -> str:
        return f"{socket.gethostname()}:{os.getpid()}"

    def _install_signal_handlers(self) -> dict[int, Any]:
        """Catch :data:`HANDLED_SIGNALS` (main thread only); return the handlers replaced."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def on_signal(signum: int, frame: FrameType | None) -> None:
            self._signals.append(signum)
            self._events.put(("signal", signum))  # SimpleQueue.put is safe in a signal handler

        return {sig: signal.signal(sig, on_signal) for sig in HANDLED_SIGNALS}
