"""The group lifecycle state machine (pydist.groups.state): every transition, the moves it
refuses, the facts it records; the GroupStates that keeps what a rank knows (the ranks gone,
the calls started) and tells the transport to fail waiters; how the failure path and the
operation queue drive a group. Fast: no processes, no sockets."""
from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pydist.core.errors import DesyncError, DistBackendError, GroupAbortedError, OpTimeoutError, PeerFailedError
from pydist.groups.failure import FailurePath
from pydist.groups.queue import OpQueue
from pydist.groups.state import (
    ABORT,
    ABORTED,
    ALLOWED,
    BROKEN,
    DESTROY,
    DESTROYED,
    FAIL,
    READY,
    TRANSITIONS,
    GroupState,
    GroupStates,
    IllegalTransition,
)
from pydist.groups.work import Work
from pydist.testing.wiring import wired_matcher
from pydist.transport.base import MessageKey, Request
from pydist.transport.matching import Matcher

STATES = [READY, ABORTED, BROKEN, DESTROYED]
EVENTS = [ABORT, FAIL, DESTROY]
KEY = MessageKey(group=7, seq=1, tag=0)


def fire(state: GroupState, event: str, error: BaseException | None = None) -> None:
    {ABORT: state.abort, FAIL: state.fail, DESTROY: lambda _error: state.destroy()}[event](error)


def in_state(name: str) -> GroupState:
    """A GroupState brought to ``name`` by legal events."""
    state = GroupState(7, [0, 1, 2])
    path = {READY: [], ABORTED: [ABORT], BROKEN: [FAIL], DESTROYED: [DESTROY]}[name]
    for event in path:
        fire(state, event, GroupAbortedError(f"first {event}", rank=1))
    assert state.state == name
    return state


# -- the table -----------------------------------------------------------------------------
EXPECTED = {
    (READY, ABORT): ABORTED, (READY, FAIL): BROKEN, (READY, DESTROY): DESTROYED,
    (ABORTED, ABORT): ABORTED, (ABORTED, FAIL): BROKEN, (ABORTED, DESTROY): DESTROYED,
    (BROKEN, ABORT): BROKEN, (BROKEN, FAIL): BROKEN, (BROKEN, DESTROY): DESTROYED,
    (DESTROYED, ABORT): DESTROYED, (DESTROYED, FAIL): DESTROYED, (DESTROYED, DESTROY): DESTROYED,
}


@pytest.mark.parametrize("start,event", sorted(EXPECTED))
def test_every_transition(start, event):
    state = in_state(start)
    fire(state, event, OpTimeoutError("late"))
    assert state.state == EXPECTED[start, event] == TRANSITIONS[start][event]
    assert (start, state.state) in ALLOWED


def test_the_table_covers_every_state_and_event_and_only_allowed_moves():
    assert set(TRANSITIONS) == set(STATES)
    assert all(set(TRANSITIONS[s]) == set(EVENTS) for s in STATES)
    assert {(s, TRANSITIONS[s][e]) for s in STATES for e in EVENTS} <= ALLOWED


@pytest.mark.parametrize("start,end", [(s, READY) for s in STATES if s != READY]
                         + [(DESTROYED, s) for s in STATES if s != DESTROYED] + [(BROKEN, ABORTED)])
def test_illegal_moves_are_refused(start, end, monkeypatch):
    """No way back to READY, out of DESTROYED, or from BROKEN to ABORTED: even a table
    edited to lead there is refused, and the state stays put."""
    assert (start, end) not in ALLOWED
    state = in_state(start)
    monkeypatch.setitem(TRANSITIONS, start, {**TRANSITIONS[start], ABORT: end})
    with pytest.raises(IllegalTransition, match=f"from {start} to {end}"):
        state.abort(GroupAbortedError("x"))
    assert state.state == start


def test_unknown_event_is_refused():
    state = GroupState()
    with pytest.raises(IllegalTransition, match="reopen may not move it from ready to None"):
        state._move("reopen", None)
    assert state.state == READY


@given(st.lists(st.sampled_from(EVENTS), max_size=12))
def test_any_sequence_of_events_only_makes_allowed_moves_and_keeps_the_first_error(events):
    state = GroupState(7, [0, 1])
    errors = [GroupAbortedError(f"e{i}", rank=0) for i in range(len(events))]
    left_ready = None
    for event, error in zip(events, errors):
        before = state.state
        fire(state, event, error)
        assert (before, state.state) in ALLOWED
        if before == READY and state.state != READY and left_ready is None:
            left_ready = error if event != DESTROY else False
    assert state.error is (left_ready or None)
    aborts = [e for ev, e in zip(events, errors) if ev == ABORT]
    assert state.aborted is (aborts[0] if aborts else None)


# -- the facts recorded --------------------------------------------------------------------
def test_abort_then_fail_keeps_both_errors_and_the_first_as_the_cause():
    state = GroupState(7, [0, 1])
    abort, failure = GroupAbortedError("rank 1 aborted", rank=1), GroupAbortedError("all_reduce: rank 1 aborted")
    state.abort(abort)
    state.fail(failure)
    state.abort(GroupAbortedError("another"))
    state.fail(OpTimeoutError("another"))
    assert (state.state, state.error, state.aborted, state.failed) == (BROKEN, abort, abort, failure)
    state.destroy()
    assert (state.state, state.error, state.aborted, state.failed) == (DESTROYED, abort, abort, failure)


def test_destroy_from_ready_has_no_error_and_a_late_abort_is_still_recorded():
    state = GroupState(7, [0, 1])
    state.destroy()
    state.destroy()
    late = GroupAbortedError("late", rank=1)
    state.abort(late)
    assert (state.state, state.error, state.aborted) == (DESTROYED, None, late)


def test_dead_members_from_the_transport_and_from_a_peers_abort():
    states = GroupStates()
    state = states.register(7, [0, 1, 2])
    first = PeerFailedError("rank 2 died", rank=2)
    states.peer_gone(2, first)
    states.peer_gone(2, PeerFailedError("again", rank=2))
    states.peer_gone(5, PeerFailedError("not a member", rank=5))
    assert state.dead == {2: first} and state.state == READY  # a death alone changes no state
    named = PeerFailedError("rank 1 failed (rank 0 saw it and aborted the group)", rank=1)
    state.abort(named)
    assert state.dead == {2: first, 1: named} and state.state == ABORTED
    state.abort(GroupAbortedError("not a death", rank=0))
    assert sorted(state.dead) == [1, 2]


def test_failure_is_the_abort_else_the_first_dead_of_the_sources():
    states = GroupStates()
    state = states.register(7, [0, 1, 2, 3])
    assert state.failure([0, 1, 2]) is None
    two, three = PeerFailedError("2", rank=2), PeerFailedError("3", rank=3)
    states.peer_gone(3, three)
    states.peer_gone(2, two)
    assert state.failure([0, 1]) is None
    assert state.failure([0, 2, 3]) is two and state.failure([3, 2]) is three
    abort = GroupAbortedError("aborted", rank=0)
    state.abort(abort)
    assert state.failure([0]) is abort


def test_the_table_registers_groups_and_records_the_dead_in_each():
    states = GroupStates()
    gone = PeerFailedError("rank 3 died", rank=3)
    states.peer_gone(3, gone)
    states.peer_gone(3, PeerFailedError("again", rank=3))
    a = states.register(1, [0, 3])
    b = states.register(2, [0, 1])
    assert states.register(1, [0, 3]) is a and states.by_id == {1: a, 2: b}
    assert a.dead == {3: gone} and b.dead == {} and states.dead == {3: gone}
    one = PeerFailedError("rank 1 died", rank=1)
    states.peer_gone(1, one)
    assert a.dead == {3: gone} and b.dead == {1: one}


def test_an_abort_before_the_group_is_made_lands_in_the_state_it_later_gets():
    states = GroupStates()
    named = PeerFailedError("rank 9 failed", rank=9)
    states.abort_group(4, named)
    early = states.by_id[4]
    assert early.state == ABORTED and early.members is None and early.dead == {9: named}
    states.peer_gone(2, PeerFailedError("rank 2 died", rank=2))
    state = states.register(4, [0, 1, 2])
    assert state is early and state.aborted is named
    assert sorted(state.dead) == [2]  # rank 9 is no member: left out


class Recorder:
    """A carrier that notes what GroupStates tells it, with what GroupStates knew by then."""

    def __init__(self, states: GroupStates):
        self.states, self.heard = states, []

    def failed_peer(self, peer, error):
        self.heard.append(("peer", peer, sorted(self.states.dead)))

    def failed_group(self, group, error):
        self.heard.append(("group", group, self.states.by_id[group].aborted is error))

    def held_calls(self, group, seq):
        return [(1, MessageKey(group, seq, 0), 0x2222)] if (group, seq) == (KEY.group, KEY.seq) else []


def test_the_carrier_hears_of_a_failure_after_it_is_recorded():
    """The world transport fails waiters and wakes arena sleepers on these calls: by then the
    death or the abort is recorded, so a waiter that looks sees it."""
    states = GroupStates()
    states.carrier = carrier = Recorder(states)
    states.peer_gone(3, PeerFailedError("rank 3 died", rank=3))
    states.abort_group(KEY.group, DistBackendError("aborted"))
    assert carrier.heard == [("peer", 3, [3]), ("group", KEY.group, True)]


def test_a_call_started_here_and_a_held_message_of_another_call_abort_the_group():
    states = GroupStates()
    states.carrier = Recorder(states)
    state = states.register(KEY.group, [0, 1])
    state.started(KEY.seq, 0x1111)
    assert state.state == ABORTED and isinstance(state.error, DesyncError)
    assert states.call_of(KEY.group, KEY.seq) == 0x1111 and states.call_of(KEY.group, KEY.seq + 1) == 0


def test_concurrent_events_keep_exactly_one_first_error():
    state = GroupState(7, [0, 1])
    errors = [GroupAbortedError(str(i)) for i in range(64)]
    threads = [threading.Thread(target=(state.abort if i % 2 else state.fail), args=(e,))
               for i, e in enumerate(errors)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert state.state == BROKEN
    assert state.error in (state.aborted, state.failed)
    assert state.aborted in errors[1::2] and state.failed in errors[0::2]


# -- who fires the events --------------------------------------------------------------------
def wired() -> tuple[GroupStates, Matcher]:
    """A GroupStates and a matcher wired as the world transport wires them."""
    matcher = wired_matcher()
    return matcher.events, matcher  # type: ignore[return-value]


def receive(matcher: Matcher, source: int | None = 1, key: MessageKey = KEY) -> Request:
    request = Request(source, memoryview(bytearray(4)))
    matcher.post(request, source, key)
    return request


def test_a_peers_abort_moves_the_group_to_aborted_and_fails_its_receives():
    states, matcher = wired()
    state = states.register(KEY.group, [0, 1])
    pending = receive(matcher)
    abort = GroupAbortedError("rank 1 aborted", rank=1)
    states.abort_group(KEY.group, abort)
    assert state.state == ABORTED and state.error is abort
    assert pending.error is abort and receive(matcher).error is abort
    assert receive(matcher, key=MessageKey(8, 1, 0)).done() is False  # other groups go on


def test_a_desync_aborts_the_group():
    """A message of another call for an operation this rank started, in either order."""
    for started_first in (True, False):
        states, matcher = wired()
        state = states.register(KEY.group, [0, 1])
        if started_first:
            state.started(KEY.seq, 0x1111)
        matcher.arrive(1, KEY, 4, call=0x2222)
        if not started_first:
            state.started(KEY.seq, 0x1111)
        assert state.state == ABORTED and isinstance(state.error, DesyncError), started_first


def test_a_gone_source_is_dead_for_its_groups_and_fails_its_receives():
    states, matcher = wired()
    state = states.register(KEY.group, [0, 1])
    other = states.register(8, [0, 2])
    pending = receive(matcher)
    gone = PeerFailedError("rank 1 died", rank=1)
    states.peer_gone(1, gone)
    assert state.dead == {1: gone} and other.dead == {} and state.state == READY
    assert pending.error is gone and receive(matcher).error is gone


class Engine:
    """An engine that records the aborts the failure path sends."""

    def __init__(self):
        self.aborts = []

    def abort_peers(self, error):
        self.aborts.append(error)

    def evicted(self):
        return None  # the others did not declare this rank dead


def _run_now(queue: OpQueue, body) -> bool:
    """``body(seq)`` on the latency path, as ProcessGroup.run takes it (True: it ran)."""
    seq = queue.claim()
    if seq is None:
        return False
    try:
        body(seq)
    finally:
        queue.release()
    return True


def test_a_failed_operation_breaks_the_group_and_later_ones_fail_fast():
    state, engine = GroupState(7, [0, 1]), Engine()
    failures = FailurePath(7, engine, state, [0, 1], [0, 1], None, 30.0)
    queue = OpQueue("g", state)
    timeout = OpTimeoutError("all_reduce seq 1 timed out")

    def failing(seq):
        try:
            raise timeout
        except OpTimeoutError as error:
            raise failures.collective(error, seq) from None

    with pytest.raises(OpTimeoutError):
        _run_now(queue, failing)
    assert (state.state, state.failed) == (BROKEN, timeout) and engine.aborts == [timeout]
    ran = []
    with pytest.raises(DistBackendError, match=r"g is broken: an earlier operation failed \(all_reduce seq 1"):
        _run_now(queue, ran.append)
    work = queue.submit(lambda seq: ran.append(seq), Work("op", []), blocking=False)
    with pytest.raises(DistBackendError, match="seq 3 was not run"):
        work.wait()
    assert ran == []
    queue.close(1.0)


def test_an_aborted_group_still_runs_operations_and_a_non_dist_error_does_not_break_it():
    state, engine = GroupState(7, [0, 1]), Engine()
    failures = FailurePath(7, engine, state, [0, 1], [0, 1], None, 30.0)
    queue = OpQueue("g", state)
    state.abort(GroupAbortedError("rank 1 aborted", rank=1))
    ran = []
    assert _run_now(queue, ran.append) and ran == [1]
    assert failures.collective(ValueError("misuse"), 2).args == ("misuse",)
    assert state.state == ABORTED and engine.aborts == []
    peer_abort = GroupAbortedError("rank 1 aborted", rank=1)
    assert failures.collective(peer_abort, 3) is peer_abort
    assert state.state == BROKEN and engine.aborts == []  # a peer's abort is not sent back
    queue.close(1.0)


def test_close_destroys_the_group_and_later_submissions_raise():
    state = GroupState(7, [0, 1])
    queue = OpQueue("g", state)
    done = queue.submit(lambda seq: None, Work("op", []), blocking=False)
    queue.close(5.0)
    assert done.wait() and state.state == DESTROYED
    queue.close(1.0)  # idempotent
    with pytest.raises(DistBackendError, match="g has been destroyed"):
        _run_now(queue, lambda seq: None)
    with pytest.raises(DistBackendError, match="g has been destroyed"):
        queue.submit(lambda seq: None, Work("op", []), blocking=True)


def test_a_rank_its_peers_declared_dead_raises_that_and_tells_nobody():
    """Stopped past PYDIST_PEER_TIMEOUT, a rank wakes to its peers' closed connections: what it
    raises is EvictedError (caused by what it saw), its group is broken, no abort is sent."""
    from pydist.core.errors import EvictedError

    class Evicted(Engine):
        def evicted(self):
            return EvictedError("rank 0 declared rank 1 dead", rank=0)

    state, engine = GroupState(7, [0, 1]), Evicted()
    failures = FailurePath(7, engine, state, [0, 1], [0, 1], None, 30.0)
    seen = PeerFailedError("rank 0 closed its connection", rank=0)
    raised = failures.collective(seen, 3)
    assert isinstance(raised, EvictedError) and raised.__cause__ is seen
    assert state.state == BROKEN and engine.aborts == []
    assert isinstance(failures.point_to_point(seen), EvictedError)
