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
import time
import uuid
from queue import Empty, SimpleQueue
from types import FrameType
from typing import Any, BinaryIO

from ..core import deadline as _deadline
from ..transport.shm.segment import remove_stale
from .agent_rendezvous import (
    Interrupted,
    MalformedRecord,
    NodeRecord,
    Rendezvous,
    RendezvousError,
    RendezvousSettings,
    Round,
)
from .config import OMP_NOTE, LaunchConfig, Placement, worker_env
from .endpoint import EndpointError, open_store
from .failure import WorkerExit, classify_exits, format_summary
from .logs import STDERR, STDOUT, LogDirs
from .output import OutputPump, write_bytes
from .secret import job_secret
from .worker_store import WorkerStore
from .workers import Worker, spawn, sweep_groups, watch

#: Signals the launcher catches and forwards to the workers (torchrun's --signals-to-handle default).
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
EXIT_WORKER_FAILED = 1
#: Seconds to wait for pipes still held open by stray grandchildren after the workers exited.
PIPE_DRAIN_TIMEOUT = 2.0
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


class RoundRun:
    """This node's workers during one round: start them, watch them and the round's stop
    record, stop them; :meth:`run` returns the round's outcome (a stop record, or
    ``{"reason": "done"}``)."""

    def __init__(self, agent: Agent, rdzv: Rendezvous, round_: Round, placement: Placement, logs: LogDirs):
        self.agent, self.rdzv, self.round, self.placement, self.logs = agent, rdzv, round_, placement, logs
        self.config = agent.config
        self.workers: list[Worker] = []
        self.replaced: list[WorkerExit] = []  # workers that failed and were replaced (--on-failure replace)
        self.error_files: list[str] = []
        self._files: list[BinaryIO] = []
        self._stopping_since: float | None = None
        self._outcome: dict[str, Any] | None = None
        self._pump = OutputPump()
        self._alive: set[int] = set()  # local ranks whose worker runs

    def run(self) -> dict[str, Any]:
        pump = self._pump
        try:
            try:
                self._spawn_all()
            except OSError as exc:
                self.agent._say(f"cannot start worker {len(self.workers)} ({' '.join(self.config.command)}): {exc}")
                self._fail_to_start(exc)
            pump.start(more_to_come=self.config.on_failure == "replace")
            self._monitor()
            pump.no_more()
        finally:
            for worker in self.workers:  # only reached with live workers if the agent itself broke
                if worker.proc.returncode is None:
                    worker.signal_group(signal.SIGKILL)
                    worker.proc.wait()
            sweep_groups(self.workers, self.config.shutdown_timeout)
            _remove_dead_workers_segments()
            if not pump.wait(PIPE_DRAIN_TIMEOUT):
                pump.stop()
            for file in self._files:
                file.close()
        if self._outcome is None:
            self._outcome = self._finish()
            lost = [w.exit for w in self.workers if w.exit is not None and w.exit.failed]
            if self.replaced and self._outcome.get("reason") == "done":
                self.agent._say(f"{len(self.replaced)} worker(s) failed and were replaced: "
                                + ", ".join(f"rank {e.rank} ({e.describe()})" for e in self.replaced))
            if lost and self._outcome.get("reason") == "done":  # --on-failure continue (or replace)
                self._report_lost(lost)
        if self._outcome.get("reason") == "failure":
            self._report(self._outcome)
        return self._outcome

    # -- starting ------------------------------------------------------------------------
    def _spawn_all(self) -> None:
        for local_rank in range(self.config.nproc_per_node):
            self.workers.append(self._spawn(local_rank))

    def _spawn(self, local_rank: int, joining: bool = False) -> Worker:
        """Start worker ``local_rank`` (``joining``: a replacement, which joins the running job)."""
        rank = self.placement.node_rank * self.config.nproc_per_node + local_rank
        folder = self.logs.worker_dir(self.round.number, local_rank)
        error_file = os.path.join(folder, "error.json")
        if joining:
            self.error_files[local_rank] = error_file
        else:
            self.error_files.append(error_file)
        env = worker_env(self.config, self.placement, local_rank, error_file, self.agent.auth_token)
        if joining:
            env["PYDIST_JOIN"] = "1"
        worker = spawn(self.config.command, env, rank, local_rank)
        agent = self.agent
        for fd, stream, console, name in ((worker.stdout_fd, STDOUT, agent._stdout, "stdout.log"),
                                          (worker.stderr_fd, STDERR, agent._stderr, "stderr.log")):
            spec = self.config.logs
            files = (self._open(os.path.join(folder, name)),) if spec.to_file(local_rank, stream) else ()
            tail = worker.stderr_tail if stream == STDERR else None
            self._pump.add(fd, f"[rank{rank}]:", console if spec.to_console(local_rank, stream) else None, tail, files)
        self._alive.add(local_rank)
        watch(worker, agent._events)
        return worker

    def _open(self, path: str) -> BinaryIO:
        file = open(path, "ab")
        self._files.append(file)
        return file

    def _fail_to_start(self, exc: OSError) -> None:
        rank = self.placement.node_rank * self.config.nproc_per_node + len(self.workers)
        failed = WorkerExit(rank, len(self.workers), -1, 1, time.time(), _deadline.now(), self.rdzv.me.where(),
                            f"{type(exc).__name__}: {exc}", f"cannot start {' '.join(self.config.command)}")
        self._stop_round({"reason": "failure", "exit": failed.to_json()}, signal.SIGTERM)

    # -- watching ------------------------------------------------------------------------
    def _monitor(self) -> None:
        """Handle exits, signals and the round's stop record until every worker is reaped
        (a replacement, see _on_exit, counts from its start)."""
        alive = self._alive
        killed = hurry = False
        while alive:
            kill_at = None if self._stopping_since is None else self._stopping_since + self.config.shutdown_timeout
            timeout = self.config.monitor_interval
            if kill_at is not None and not killed:
                timeout = min(timeout, max(0.0, kill_at - _deadline.now()))
            event = self._next_event(timeout)
            if event[0] == "exit":
                alive.discard(event[1])
                self._on_exit(self.workers[event[1]], event[2], event[3])
            elif event[0] == "signal" and self._stopping_since is None:
                self.agent._say(f"got {signal.Signals(event[1]).name}; stopping the workers")
                self._stop_round({"reason": "signal", "signal": event[1], "host": self.agent._where()}, event[1])
            elif event[0] == "signal":
                hurry = True  # a second signal: no more grace
            elif self._stopping_since is None:
                self._look_at_store()
            if self._stopping_since is not None and not killed and alive:
                if hurry or _deadline.now() >= self._stopping_since + self.config.shutdown_timeout:
                    for worker in self.workers:
                        if worker.local_rank in alive:
                            worker.signal_group(signal.SIGKILL)
                    killed = True

    def _next_event(self, timeout: float) -> tuple[Any, ...]:
        """The next exit or signal, waiting up to ``timeout`` s on pydist's clock (the SIGKILL
        deadline is on it); ``("tick",)`` when none came."""
        got: list[tuple[Any, ...]] = []

        def arrived(seconds: float | None) -> bool:
            try:
                got.append(self.agent._events.get(timeout=seconds))
            except Empty:
                return False
            return True

        return got[0] if _deadline.timed_wait(arrived, timeout) else ("tick",)

    def _on_exit(self, worker: Worker, mono: float, wall: float) -> None:
        worker.exit = WorkerExit(worker.rank, worker.local_rank, worker.pid, worker.proc.returncode, wall, mono,
                                 self.rdzv.me.where(), stopped=worker.stopped)
        if worker.exit.failed:
            worker.exit.add_output(self.error_files[worker.local_rank], list(worker.stderr_tail))
        if worker.exit.failed and self._stopping_since is None:
            if self.config.on_failure == "replace" and self._replace(worker):
                return
            if self.config.on_failure in ("continue", "replace"):
                self.agent._say(f"rank {worker.rank} (pid {worker.pid}) on {worker.exit.host} failed with "
                                f"{worker.exit.describe()}; the others go on (--on-failure continue)")
                return
            self.agent._say(f"rank {worker.rank} (pid {worker.pid}) on {worker.exit.host} failed with "
                            f"{worker.exit.describe()}; stopping the other workers")
            self._stop_round({"reason": "failure", "exit": worker.exit.to_json()}, signal.SIGTERM)

    def _replace(self, worker: Worker) -> bool:
        """Start a replacement for the failed ``worker`` in its slot (same LOCAL_RANK, marked
        PYDIST_JOIN=1: it joins the running job), if the job has replacements left."""
        try:
            used = self.rdzv.count_replacement(self.round.number)
        except (OSError, RuntimeError):
            return False  # the store is gone: nothing to join
        allowed = self.config.max_replacements
        assert worker.exit is not None  # called for a worker that exited
        if used > allowed:
            self.agent._say(f"rank {worker.rank} failed with {worker.exit.describe()}; no replacements left "
                            f"(--max-replacements {allowed}): the others go on")
            return False
        try:
            replacement = self._spawn(worker.local_rank, joining=True)
        except OSError as exc:
            self.agent._say(f"cannot start a replacement for rank {worker.rank}: {exc}")
            return False
        self.replaced.append(worker.exit)
        self.workers[worker.local_rank] = replacement
        self.agent._say(f"rank {worker.rank} (pid {worker.pid}) on {worker.exit.host} failed with "
                        f"{worker.exit.describe()}; replacement {used} of {allowed} started (pid {replacement.pid}), "
                        "joining the job")
        return True

    def _look_at_store(self) -> None:
        try:
            record = self.rdzv.stop_record(self.round.number)
        except MalformedRecord as exc:  # the round cannot go on: nobody knows why it stops
            record = {"reason": "store", "message": str(exc)}
        except (OSError, RuntimeError) as exc:
            record = {"reason": "store", "message": f"lost the job's store at {self.placement.master_addr}:"
                                                     f"{self.placement.master_port}: {exc}"}
        if record is not None:
            self._outcome = record
            self._stop(signal.SIGTERM)

    def _stop_round(self, why: dict[str, Any], sig: int) -> None:
        """Ask every node to stop this round (the first request wins), and stop here."""
        try:
            self._outcome = self.rdzv.request_stop(self.round.number, why)
        except MalformedRecord as exc:
            self._outcome = {"reason": "store", "message": str(exc)}
        except (OSError, RuntimeError) as exc:
            self._outcome = {**why, "restarts_used": self.config.max_restarts,
                             "note": f"the job's store is unreachable: {exc}"}
        self._stop(sig)

    def _stop(self, sig: int) -> None:
        """Start stopping: send ``sig`` to every worker group that has not exited yet."""
        self._stopping_since = _deadline.now()
        for worker in self.workers:
            worker.stop(sig)

    # -- the end of the round ------------------------------------------------------------
    def _finish(self) -> dict[str, Any]:
        """Every local worker succeeded: wait until every node's did, or the round stops."""
        try:
            self.rdzv.finished(self.round.number)
            while not self.rdzv.all_finished(self.round):
                record = self.rdzv.stop_record(self.round.number)
                if record is not None:
                    return record
                if self.agent._signals:
                    why = {"reason": "signal", "signal": self.agent._signals[0], "host": self.agent._where()}
                    return self.rdzv.request_stop(self.round.number, why)
                time.sleep(self.config.monitor_interval)  # real time: a poll's pace; no deadline ends it
        except MalformedRecord as exc:
            return {"reason": "store", "message": str(exc)}
        except (OSError, RuntimeError) as exc:
            return {"reason": "store", "message": f"lost the job's store while waiting for the other nodes: {exc}"}
        return {"reason": "done"}

    def _report_lost(self, lost: list[WorkerExit]) -> None:
        """--on-failure continue (or replace, without replacements left): the workers that
        failed while the others went on; the round fails when none of this node's workers
        exited 0."""
        lost.sort(key=lambda e: e.failed_at)
        survivors = len(self.workers) - len(lost)
        self.agent._say(f"{len(lost)} worker(s) failed and {survivors} finished: "
                        + ", ".join(f"rank {e.rank} ({e.describe()})" for e in lost))
        if not survivors:
            self._outcome = {"reason": "failure", "exit": lost[0].to_json(), "restarts_used": self.config.max_restarts}

    def _report(self, outcome: dict[str, Any]) -> None:
        """Print the root-cause summary (:func:`.failure.classify_exits`): the first failure by
        the time it happened, whichever node reported it; this node's workers that failed on
        their own; the workers the launcher stopped (signalled while they ran), echoes included."""
        reported = WorkerExit.from_json(outcome["exit"])
        root, others, stopped = classify_exits(reported, [w.exit for w in self.workers if w.exit is not None])
        name = self.config.entrypoint or self.config.command[0]
        write_bytes(self.agent._stderr, (format_summary(name, root, others, stopped) + "\n").encode())


def _remove_dead_workers_segments() -> None:
    """Unlink the shared-memory segments whose creators are gone: a segment is unlinked by the
    last member to map it, so workers stopped (or killed) before all members mapped one leave
    it behind; the launcher sweeps them once its workers have exited."""
    try:
        remove_stale()
    except OSError:  # no /dev/shm here: no segments either
        pass

