"""The one admission policy of every listener (pydist.net.admission.Gate), on made-up times:
each unproven connection's deadline, the cap and whom it drops (the least progress, the
oldest of those, never the newcomer), a proof taking a connection out of reach; and the
accept loop's one error policy (pydist.net.accepting), on a listener that fails on cue."""
from __future__ import annotations

import errno
import socket

import pytest

from pydist.net import accepting
from pydist.net import admission as policy
from pydist.net.accepting import accept_ready
from pydist.net.admission import GREETED, HEARD, Gate


@pytest.fixture
def cap_of_3(monkeypatch):
    monkeypatch.setattr(policy, "MAX_UNPROVEN", 3)


def test_every_unproven_connection_is_late_at_its_deadline_talking_or_not():
    gate: Gate[str] = Gate(timeout=5.0)
    gate.admit("silent", 100.0)
    gate.admit("talking", 101.0)
    gate.progress("talking", GREETED)
    assert gate.due() == 105.0 and gate.late(104.9) == []
    assert gate.late(105.0) == ["silent"] and gate.due() == 106.0
    assert gate.late(200.0) == ["talking"] and gate.due() is None and len(gate) == 0


def test_no_timeout_means_no_deadline():
    gate: Gate[str] = Gate(timeout=0.0)
    gate.admit("a", 100.0)
    assert gate.due() is None and gate.late(1e9) == [] and "a" in gate


def test_a_proven_connection_is_out_of_reach(cap_of_3):
    gate: Gate[str] = Gate(timeout=5.0)
    gate.admit("a", 100.0)
    assert gate.prove("a") and not gate.prove("a")  # the second time: it was not held any more
    assert gate.late(1000.0) == [] and gate.victim() is None


def test_the_cap_drops_the_least_progress_then_the_oldest_never_the_newcomer(cap_of_3):
    gate: Gate[str] = Gate(timeout=5.0)
    for key in ("t1", "t2", "s1"):
        gate.admit(key, 100.0)
    gate.progress("t1", HEARD)
    gate.progress("t2", GREETED)
    assert gate.admit("s2", 101.0) == ["s1"]  # silent and older than the newcomer
    assert gate.admit("s3", 102.0) == ["s2"]
    gate.progress("s3", HEARD)
    assert gate.admit("new", 103.0) == ["t1"]  # t1 and s3 heard, t1 the older; the newcomer spared
    assert gate.victim() == "new" and [key for key in ("t1", "t2", "s1", "s2", "s3", "new") if key in gate] == [
        "t2", "s3", "new"]


def test_a_flood_of_one_byte_talkers_cannot_keep_a_newcomer_out(cap_of_3):
    gate: Gate[int] = Gate(timeout=5.0)
    for n in range(3):
        gate.admit(n, 100.0)
        gate.progress(n, HEARD)
    assert gate.admit(99, 100.5) == [0]  # the real client's connection, silent for now, stays
    gate.progress(99, GREETED)  # its hello answered: after every talker
    dropped: list[int] = []
    for n in range(3, 10):  # more one-byte talkers
        dropped += gate.admit(n, 101.0)
        gate.progress(n, HEARD)
    assert 99 not in dropped and 99 in gate


def test_the_cap_is_a_share_of_the_descriptors_and_fits_every_expected_peer(monkeypatch):
    monkeypatch.setattr(policy.resource, "getrlimit", lambda which: (1024, 1024))
    assert policy.cap() == 1024 // policy.FD_SHARE and policy.cap(expected=300) == 600
    monkeypatch.setattr(policy.resource, "getrlimit", lambda which: (1 << 20, 1 << 20))
    assert policy.cap() == policy.MAX_UNPROVEN


def test_shortening_a_deadline_drops_it_earlier():
    gate: Gate[str] = Gate(timeout=5.0)
    gate.admit("refused", 100.0)
    gate.shorten("refused", 101.0)
    gate.shorten("refused", 104.0)  # later than now due: ignored
    assert gate.due() == 101.0 and gate.late(101.0) == ["refused"] and gate.due() is None


# -- the accept loop ------------------------------------------------------------------------------
class _Failing(socket.socket):
    """A listening socket whose accept raises the errors in ``errors`` first, then works."""

    def __init__(self, *errors: int):
        super().__init__(socket.AF_INET, socket.SOCK_STREAM)
        self.bind(("127.0.0.1", 0))
        self.listen(16)
        self.setblocking(False)
        self.errors = [OSError(code, errno.errorcode[code]) for code in errors]

    def accept(self):
        if self.errors:
            raise self.errors.pop(0)
        return super().accept()


def _accepting(listener: _Failing, gate: Gate[str]) -> tuple[list, list, list]:
    """accept_ready once on ``listener``: (the connections admitted, dropped, failures reported)."""
    admitted: list = []
    dropped: list = []
    failed: list = []
    accept_ready(listener, lambda sock, where: admitted.append(sock), gate,
                 lambda key, why: dropped.append((key, gate.discard(key), why)), failed.append)
    return admitted, dropped, failed


def test_out_of_descriptors_the_victim_is_dropped_and_accept_retried():
    listener = _Failing(errno.EMFILE, errno.ENFILE)
    gate: Gate[str] = Gate(timeout=5.0)
    gate.admit("idle", 100.0)
    gate.admit("talking", 100.0)
    gate.progress("talking", HEARD)
    with listener, socket.create_connection(listener.getsockname()):
        admitted, dropped, failed = _accepting(listener, gate)
        for sock in admitted:
            sock.close()
    assert [key for key, _, _ in dropped] == ["idle", "talking"] and len(admitted) == 1 and not failed
    assert "out of descriptors ([Errno 24] EMFILE)" in dropped[0][2]


def test_with_nothing_to_drop_a_failed_accept_is_reported_and_paused(monkeypatch):
    pauses: list = []
    monkeypatch.setattr(accepting.time, "sleep", pauses.append)
    listener = _Failing(errno.EMFILE)
    with listener:
        admitted, dropped, failed = _accepting(listener, Gate(timeout=5.0))
    assert not admitted and not dropped and [error.errno for error in failed] == [errno.EMFILE]
    assert pauses == [accepting.BACKOFF_SECONDS]


def test_a_connection_gone_while_it_waited_is_skipped():
    listener = _Failing(errno.ECONNABORTED)
    with listener, socket.create_connection(listener.getsockname()):
        admitted, dropped, failed = _accepting(listener, Gate(timeout=5.0))
        for sock in admitted:
            sock.close()
    assert len(admitted) == 1 and not dropped and not failed


def test_the_descriptor_limit_is_raised_to_the_hard_one(monkeypatch):
    limits = {"now": (1024, 4096)}
    monkeypatch.setattr(accepting.resource, "getrlimit", lambda which: limits["now"])
    monkeypatch.setattr(accepting.resource, "setrlimit", lambda which, value: limits.update(now=value))
    assert accepting.raise_descriptor_limit() == 4096 and limits["now"] == (4096, 4096)
