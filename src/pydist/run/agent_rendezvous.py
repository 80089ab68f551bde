"""How the agents of one job meet (torchrun's c10d rendezvous, over the job's store).

The agents meet in numbered rounds. A round admits agents until ``max_nodes`` joined, or
until ``min_nodes`` joined and ``last_call`` seconds passed; then it closes, fixing its
members. Node ranks are assigned deterministically: by ``--node-rank`` (static
rendezvous), else by (address, host name, agent id). Every member then runs its workers
until someone asks the round to stop (a failed worker, a signal, an agent that arrived
late and wants in); the stop record that came first says why, and everyone acts on it.

Keys, under ``rdzv/<run id>/``::

    round            the newest round's number
    r<N>/joined      counter of agents that joined round N (slot = value - 1)
    r<N>/node/<slot> that agent's record (JSON)
    r<N>/closed      the number of members, written once: slots below it are members
    r<N>/stop        why round N's workers stop (JSON), written once
    r<N>/done        counter of members whose workers all succeeded
    r<N>/left        counter of members that will not touch the store again
    r<N>/<name>      what one member tells the others about round N (see ``publish``), e.g.
                     ``workers_store``: where round N's workers find their store
    restarts         failure restarts used so far, for the whole job
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, NoReturn, TypeVar

from ..core import deadline as _deadline
from . import records as _records

_T = TypeVar("_T")

#: Seconds between looks at the store while waiting for other agents.
POLL_S = 0.05


class RendezvousError(RuntimeError):
    """The agents could not form a valid round (timeout, mismatched settings). A round its
    ``members`` all refused (their settings disagree) is ``round_number``; this agent has
    left it (see ``wait_left``)."""

    def __init__(self, message: str, round_number: int | None = None, members: int = 0):
        super().__init__(message)
        self.round_number = round_number
        self.members = members


class MalformedRecord(RendezvousError):
    """A record in the job's store is not what the agents write (bad JSON, another shape, a
    field of another type); the message names the key."""

    def __init__(self, run_id: str, key: str, why: str):
        super().__init__(f"rendezvous '{run_id}': malformed record at key '{key}' in the job's store: {why} "
                         "(pydist-run's agents did not write it)")
        self.key = key


class Interrupted(Exception):
    """The agent was told to stop while it waited for other agents."""


@dataclass(frozen=True)
class NodeRecord:
    """What an agent tells the others about itself."""

    agent_id: str
    host: str
    addr: str
    nproc: int
    node_rank: int  # --node-rank, or -1 when the rendezvous assigns it

    def where(self) -> str:
        return f"{self.host} ({self.addr})" if self.addr and self.addr != self.host else self.host


@dataclass(frozen=True)
class Round:
    """A closed round as one member sees it."""

    number: int
    node_rank: int
    members: tuple[NodeRecord, ...]

    @property
    def nnodes(self) -> int:
        return len(self.members)

    @property
    def nproc(self) -> int:
        return self.members[0].nproc

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc


@dataclass(frozen=True)
class RendezvousSettings:
    """``--nnodes MIN:MAX``, ``--rdzv-id`` and ``--rdzv-conf`` timeouts (seconds)."""

    run_id: str
    min_nodes: int
    max_nodes: int
    join_timeout: float = 600.0
    last_call: float = 30.0
    static: bool = False


class Rendezvous:
    """One agent's side of the rendezvous, over a store shared by every agent."""

    def __init__(self, store: Any, settings: RendezvousSettings, me: NodeRecord,
                 interrupted: Callable[[], bool] = lambda: False):
        self.store = store
        self.settings = settings
        self.me = me
        self._interrupted = interrupted
        self._prefix = f"rdzv/{settings.run_id}/"

    def _pause(self) -> None:
        """Sleep between looks at the store (on pydist's clock, as the deadlines the looks end
        at); raises Interrupted when told to stop."""
        if self._interrupted():
            raise Interrupted()
        _deadline.sleep(POLL_S)

    def _key(self, name: str) -> str:
        return self._prefix + name

    def _int(self, name: str) -> int:
        return self.store.add(self._key(name), 0)

    def _parse(self, key: str, raw: bytes | str, parse: Callable[[bytes | str], _T]) -> _T:
        """``parse(raw)``, the value of ``key``; MalformedRecord naming the key if it fails."""
        try:
            return parse(raw)
        except ValueError as error:
            raise MalformedRecord(self.settings.run_id, key, str(error)) from None

    def read(self, name: str, parse: Callable[[bytes | str], _T]) -> _T:
        """The record ``name`` (waiting for it up to the store's timeout), parsed by ``parse``
        (a function of :mod:`.records`); MalformedRecord naming the key if it is malformed."""
        key = self._key(name)
        return self._parse(key, self.store.get(key), parse)

    # -- joining -------------------------------------------------------------------------
    def join(self) -> Round:
        """Join the next round that admits this agent and wait until it closes. Raises
        RendezvousError on timeout or when the members' settings disagree."""
        deadline = _deadline.now() + self.settings.join_timeout
        while True:
            number = self._open_round()
            slot = self.store.add(self._key(f"r{number}/joined"), 1) - 1
            self.store.set(self._key(f"r{number}/node/{slot}"), json.dumps(asdict(self.me)))
            members = self._wait_closed(number, deadline)
            if slot < members:
                return self._round(number, slot, members)
            if members < self.settings.max_nodes:  # late, and there is room: ask for a new round
                self.request_stop(number, {"reason": "join", "host": self.me.where()})
            self._wait_newer_round(number, deadline)

    def _open_round(self) -> int:
        """The round to join: the newest one, or a new one if the newest has closed."""
        key = self._key("round")
        number = self._parse(key, self.store.compare_set(key, "", "0"), _records.integer)
        while self.store.check([self._key(f"r{number}/closed")]):
            if not self.store.check([self._key(f"r{number}/stop")]):
                return number  # running: join it as a latecomer (join() then asks it to stop)
            number = self._parse(key, self.store.compare_set(key, str(number), str(number + 1)), _records.integer)
        return number

    def _wait_closed(self, number: int, deadline: float) -> int:
        """Wait until round ``number`` closes (closing it when it is full, or when the last
        call after ``min_nodes`` is over); the number of members."""
        closed, settings = self._key(f"r{number}/closed"), self.settings
        quorum_since: float | None = None
        while True:
            if self.store.check([closed]):
                return self.read(f"r{number}/closed", _records.integer)
            joined = self._int(f"r{number}/joined")
            now = _deadline.now()
            if joined >= settings.min_nodes and quorum_since is None:
                quorum_since = now
            last_call_over = quorum_since is not None and now - quorum_since >= settings.last_call
            if joined >= settings.max_nodes or last_call_over:
                self.store.compare_set(closed, "", str(min(joined, settings.max_nodes)))
                continue
            if now > deadline:
                raise RendezvousError(self._too_few(number, joined))
            self._pause()

    def _wait_newer_round(self, number: int, deadline: float) -> None:
        stop = self._key(f"r{number}/stop")
        while self.read("round", _records.integer) <= number and not self.store.check([stop]):
            if _deadline.now() > deadline:
                raise RendezvousError(f"rendezvous '{self.settings.run_id}': no round admitted {self.me.where()} "
                                      f"within {self.settings.join_timeout:g}s (the job is full: "
                                      f"--nnodes max {self.settings.max_nodes})")
            self._pause()

    def _records(self, number: int, count: int) -> list[NodeRecord]:
        keys = [self._key(f"r{number}/node/{slot}") for slot in range(count)]
        self.store.wait(keys)
        return [self._parse(key, raw, _node_record) for key, raw in zip(keys, self.store.multi_get(keys))]

    def _too_few(self, number: int, joined: int) -> str:
        hosts = ", ".join(record.where() for record in self._records(number, joined))
        return (f"rendezvous '{self.settings.run_id}' timed out after {self.settings.join_timeout:g}s: "
                f"{joined} of at least {self.settings.min_nodes} nodes joined ({hosts})")

    def refuse(self, number: int, count: int, message: str) -> NoReturn:
        """Every member reads the same records and refuses round ``number`` alike: leave it
        (so the store's host waits for the others before closing the store), then raise."""
        try:
            self.leave(number)
        except (OSError, RuntimeError):
            pass  # the store is gone: nobody waits for this member
        raise RendezvousError(message, round_number=number, members=count)

    def _round(self, number: int, slot: int, count: int) -> Round:
        records = self._records(number, count)
        nprocs = {record.nproc for record in records}
        if len(nprocs) > 1:
            listing = ", ".join(f"{record.where()}: {record.nproc}" for record in records)
            self.refuse(number, count, f"mismatched --nproc-per-node across nodes ({listing}); every node must "
                         "use the same")
        if self.settings.static:
            ranks = sorted(record.node_rank for record in records)
            if ranks != list(range(count)):
                listing = ", ".join(f"{record.where()}: {record.node_rank}" for record in records)
                self.refuse(number, count, f"--node-rank values must be 0..{count - 1}, each once; got {listing}")
            order = sorted(records, key=lambda record: record.node_rank)
        else:
            order = sorted(records, key=lambda record: (record.addr, record.host, record.agent_id))
        return Round(number, order.index(records[slot]), tuple(order))

    # -- while a round runs --------------------------------------------------------------
    def request_stop(self, number: int, why: dict[str, Any]) -> dict[str, Any]:
        """Ask round ``number`` to stop because of ``why``; the stop record that won (the
        first one written). A failure that wins counts as a restart used."""
        if why.get("reason") == "failure":
            why = {**why, "restarts_used": self._int("restarts")}
        text, key = json.dumps(why), self._key(f"r{number}/stop")
        winner = self.store.compare_set(key, "", text)
        if winner == text.encode() and why.get("reason") == "failure":
            self.store.add(self._key("restarts"), 1)
        return self._parse(key, winner, _records.stop_record)

    def count_replacement(self, number: int) -> int:
        """One more failed worker replaced in round ``number``: how many so far, job-wide."""
        return self.store.add(self._key(f"r{number}/replacements"), 1)

    def stop_record(self, number: int) -> dict[str, Any] | None:
        """Why round ``number`` stops, or None while it runs. MalformedRecord if the record is
        not one the agents write (see :func:`.records.stop_record`)."""
        key = self._key(f"r{number}/stop")
        return self.read(f"r{number}/stop", _records.stop_record) if self.store.check([key]) else None

    def finished(self, number: int) -> None:
        """This member's workers all succeeded."""
        self.store.add(self._key(f"r{number}/done"), 1)

    def all_finished(self, round_: Round) -> bool:
        return self._int(f"r{round_.number}/done") >= round_.nnodes

    def publish(self, number: int, name: str, text: str) -> None:
        """Tell the other members of round ``number`` something under ``name``."""
        self.store.set(self._key(f"r{number}/{name}"), text)

    def published(self, number: int, name: str, timeout: float, parse: Callable[[bytes | str], _T]) -> _T:
        """What a member published under ``name`` for round ``number``, parsed by ``parse``
        (MalformedRecord if it fails), waiting for it at most ``timeout`` s (RendezvousError)
        or until this agent is told to stop (Interrupted)."""
        key, deadline = self._key(f"r{number}/{name}"), _deadline.now() + timeout
        while not self.store.check([key]):
            if _deadline.now() > deadline:
                raise RendezvousError(f"rendezvous '{self.settings.run_id}': round {number}'s node 0 did not "
                                      f"publish {name} within {timeout:g}s")
            self._pause()
        return self.read(f"r{number}/{name}", parse)

    def leave(self, number: int) -> None:
        """This member is done with the store (the agent is about to exit)."""
        self.store.add(self._key(f"r{number}/left"), 1)

    def wait_left(self, number: int, members: int, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until the ``members`` of round ``number`` left: the
        agent hosting the store calls this before it closes the store. True when they did."""
        deadline = _deadline.now() + timeout
        while self._int(f"r{number}/left") < members:
            if _deadline.now() >= deadline:
                return False
            _deadline.sleep(POLL_S)
        return True


def _node_record(raw: bytes | str) -> NodeRecord:
    return _records.dataclass_from(NodeRecord, _records.json_object(raw))
