"""The rate limit on refused-connection warnings (review finding 17: an outsider could flood
the job's log, one WARNING per connection): the limiter on a fake clock, then a flood of
refused connections at a rank's listener (its Admission) and at a store server, each
leaving a bounded number of log records that still account for every connection.

The clock is a frozen fake (pydist.core.deadline.set_clock), so no summary is due during a
flood whatever the machine's speed; each connection is waited for by reading its socket
until the far side closes it, which it does after logging why.
"""
from __future__ import annotations

import logging
import re
import socket
from collections.abc import Callable, Iterator

import pytest
from test_admission_bursts import _Driven, _until_closed

from pydist.core import deadline
from pydist.net.log_limit import LogLimit
from pydist.store._tcp_server import Server

SECONDS = 60
FLOOD = 40


class _FrozenClock:
    """A fake clock that moves only by ``advance``; timed waits run on real time."""

    def __init__(self) -> None:
        self.time = 1000.0

    def monotonic(self) -> float:
        return self.time

    def advance(self, seconds: float) -> None:
        self.time += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def wait(self, wait: Callable[[float | None], bool], timeout: float | None) -> bool:
        return wait(timeout)


@pytest.fixture
def clock() -> Iterator[_FrozenClock]:
    fake = _FrozenClock()
    previous = deadline.set_clock(fake)
    try:
        yield fake
    finally:
        deadline.set_clock(previous)


def _lines(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name and r.levelno == logging.WARNING]


# -- the limiter -----------------------------------------------------------------------------------
def test_the_first_few_in_full_then_one_summary_per_interval(clock, caplog):
    limit = LogLimit(logging.getLogger("pydist.test"), "refusals", burst=5, interval=10.0)
    with caplog.at_level(logging.WARNING, logger="pydist.test"):
        for i in range(105):
            limit.warning("refused %d", i)
        assert _lines(caplog, "pydist.test") == [f"refused {i}" for i in range(5)]
        clock.advance(9.5)
        limit.warning("refused %d", 105)
        assert len(_lines(caplog, "pydist.test")) == 5  # not an interval yet
        clock.advance(0.5)
        limit.warning("refused %d", 106)
        for i in range(107, 110):
            limit.warning("refused %d", i)
        assert _lines(caplog, "pydist.test")[5:] == [
            "refusals: 102 more in the last 10 s (rate limited), the last: refused 106"]
        clock.advance(3.0)
        limit.flush()
        limit.flush()  # nothing counted since: nothing to say
    assert _lines(caplog, "pydist.test")[6:] == [
        "refusals: 3 more in the last 3 s (rate limited), the last: refused 109"]


def test_the_period_doubles_while_the_warnings_keep_coming_and_resets_after_a_quiet_one(clock, caplog):
    limit = LogLimit(logging.getLogger("pydist.test"), "refusals", burst=1, interval=10.0)
    with caplog.at_level(logging.WARNING, logger="pydist.test"):
        limit.warning("refused")  # in full, at 0 s
        for _ in range(400):  # then one a second for 400 s
            clock.advance(1.0)
            limit.warning("refused")
        clock.advance(400.0)  # quiet for longer than the period (then 300 s)
        limit.warning("refused")  # a summary at once: it had been a period since the last line
        clock.advance(10.0)
        limit.warning("refused")  # the next 10 s later again
    lines = _lines(caplog, "pydist.test")
    assert lines[0] == "refused"
    counts = [int(line.split(": ")[1].split()[0]) for line in lines[1:]]
    assert counts == [10, 20, 40, 80, 160, 91, 1]  # at 10, 30, 70, 150, 310 s; 90 more held until the quiet one


def test_a_warning_whose_arguments_do_not_format_is_summarised_by_its_format(clock, caplog):
    limit = LogLimit(logging.getLogger("pydist.test"), "refusals", burst=0)
    with caplog.at_level(logging.WARNING, logger="pydist.test"):
        limit.warning("refused %d", "not a number")  # no line yet: a summary is due at once
        limit.flush()
    assert _lines(caplog, "pydist.test") == ["refusals: 1 more in the last 0 s (rate limited), the last: refused %d"]


def _accounted(lines: list[str], full: str) -> int:
    """How many warnings ``lines`` stand for: those containing ``full``, plus the summaries' counts."""
    summaries = [int(m.group(1)) for line in lines for m in [re.search(r": (\d+) more in the last", line)] if m]
    return sum(1 for line in lines if full in line and "more in the last" not in line) + sum(summaries)


# -- a flood at a rank's listener ---------------------------------------------------------------
def test_a_flood_of_refused_connections_at_a_rank_logs_a_bounded_number_of_lines(clock, caplog):
    with caplog.at_level(logging.WARNING, logger="pydist.transport"):
        driven = _Driven()
        try:
            for _ in range(FLOOD):
                with driven.dial() as sock:
                    sock.sendall(b"GET / HTTP/1.0\r\n\r\n" * 4)
                    _until_closed(sock)  # closed once the garbage was refused, and logged
            assert len(_lines(caplog, "pydist.transport")) == 5
        finally:
            driven.close()
    lines = _lines(caplog, "pydist.transport")
    assert len(lines) == 6 and "pydist rank 0: connections refused or dropped: 35 more" in lines[-1]
    assert _accounted(lines, "pydist rank 0 dropped a connection from") == FLOOD


# -- a flood at a store server ----------------------------------------------------------------------
def test_a_flood_of_garbage_clients_at_a_store_server_logs_a_bounded_number_of_lines(clock, caplog):
    with caplog.at_level(logging.WARNING, logger="pydist.store"):
        server = Server("127.0.0.1", 0, None)
        try:
            for _ in range(FLOOD):
                with socket.create_connection(("127.0.0.1", server.port), timeout=SECONDS) as sock:
                    sock.sendall(b"\xff" * 64)
                    _until_closed(sock)  # closed once dropped, and logged
            assert len(_lines(caplog, "pydist.store")) == 5
        finally:
            server.stop()
    lines = _lines(caplog, "pydist.store")
    assert len(lines) == 6 and f"store server 127.0.0.1:{server.port}: clients dropped: 35 more" in lines[-1]
    assert _accounted(lines, "dropping client") == FLOOD
