"""One round of the job on this node (the agent's round): start this node's workers, watch
them and the round's stop record, stop them, and report the round's failure.

A worker that fails stops the round: the agent asks every node to stop (the first request
wins, see :meth:`.agent_rendezvous.Rendezvous.request_stop`), sends SIGTERM to its workers'
process groups and SIGKILL to those still running ``--shutdown-timeout`` seconds later, then
prints the root-cause summary (:mod:`.failure`). A round also stops for a signal to any
launcher, a node that joins, or a store that went away; :meth:`RoundRun.run` returns why.
"""
from __future__ import annotations

import os
import signal
import time
from queue import Empty
from typing import TYPE_CHECKING, Any, BinaryIO

from ..core import deadline as _deadline
from ..transport.shm.segment import remove_stale
from .agent_rendezvous import MalformedRecord, Rendezvous, Round
from .config import Placement, worker_env
from .failure import WorkerExit, choose_root, classify_exits, format_configuration_error, format_summary
from .logs import STDERR, STDOUT, LogDirs
from .output import OutputPump, write_bytes
from .workers import Worker, spawn, sweep_groups, watch

if TYPE_CHECKING:
    from .agent import Agent

#: Seconds to wait for pipes still held open by stray grandchildren after the workers exited.
PIPE_DRAIN_TIMEOUT = 2.0


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
        self._root: WorkerExit | None = None  # the root cause, decided once when the round stops
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
        self._fail_round(failed)

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
                    self._kill([worker for worker in self.workers if worker.local_rank in alive], hurry)
                    killed = True

    def _kill(self, workers: list[Worker], hurry: bool) -> None:
        """SIGKILL the process groups of ``workers``, still running after the round's stop
        signal (``hurry``: a second signal came), and say so."""
        ranks = ", ".join(str(worker.rank) for worker in workers)
        why = ("got a second signal" if hurry else
               f"{'rank' if len(workers) == 1 else 'ranks'} {ranks} still running "
               f"{self.config.shutdown_timeout:g}s after the stop signal (--shutdown-timeout)")
        self.agent._say(f"{why}: sending SIGKILL to {'rank' if len(workers) == 1 else 'ranks'} {ranks}")
        for worker in workers:
            worker.signal_group(signal.SIGKILL)

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
            root = self._fail_round(worker.exit)
            what = "a configuration error (below)" if root.configuration else root.describe()
            self.agent._say(f"rank {root.rank} (pid {root.pid}) on {root.host} failed with {what}; "
                            "stopping the other workers")

    def _fail_round(self, first: WorkerExit) -> WorkerExit:
        """Stop the round for ``first``'s failure and decide its root cause, once (see
        :func:`.failure.choose_root`): among ``first``, the failures known here at this moment
        and the failure another node may have reported first. The one-line message and the
        summary both name it."""
        local = choose_root([first, *self._failing_now()])
        self._stop_round({"reason": "failure", "exit": local.to_json()}, signal.SIGTERM)
        reported = self._outcome.get("exit") if self._outcome is not None else None
        self._root = choose_root([WorkerExit.from_json(reported), local]) if reported else local
        return self._root

    def _failing_now(self) -> list[WorkerExit]:
        """This node's workers not reaped yet that have failed: exited with an error (the
        watcher has not reported it yet), or recorded an exception and still exiting."""
        failing = []
        for worker in self.workers:
            if worker.exit is not None:
                continue
            code = worker.exit_status()
            seen = WorkerExit(worker.rank, worker.local_rank, worker.pid, code, time.time(), _deadline.now(),
                              self.rdzv.me.where())
            if code != 0:
                seen.add_output(self.error_files[worker.local_rank], list(worker.stderr_tail))
            if code is not None and code != 0 or code is None and seen.recorded_at:
                failing.append(seen)
        return failing

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
            if record.get("reason") == "failure":  # another node's: weighed with the failures known here
                self._root = choose_root([WorkerExit.from_json(record["exit"]), *self._failing_now()])
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
        """Print the root-cause summary (:func:`.failure.classify_exits`) of the root cause
        decided when the round stopped (else, e.g. --on-failure continue, of the first failure
        by its own clock); this node's workers that failed on their own; the workers the
        launcher stopped (signalled while they ran), echoes included."""
        exits = [w.exit for w in self.workers if w.exit is not None]
        reported = WorkerExit.from_json(outcome["exit"])
        decided = self._root or choose_root([reported, *(e for e in exits if e.failed and not e.stopped)])
        root, others, stopped = classify_exits(decided, exits)
        name = self.config.entrypoint or self.config.command[0]
        if root.configuration:
            self.agent._say(format_configuration_error(name, root, others))
        else:
            write_bytes(self.agent._stderr, (format_summary(name, root, others, stopped) + "\n").encode())


def _remove_dead_workers_segments() -> None:
    """Unlink the shared-memory segments whose creators are gone: a segment is unlinked by the
    last member to map it, so workers stopped (or killed) before all members mapped one leave
    it behind; the launcher sweeps them once its workers have exited."""
    try:
        remove_stale()
    except OSError:  # no /dev/shm here: no segments either
        pass

