"""One transport outside a world, for its unit tests: a Matcher whose events are a
GroupStates wired to it as the world transport wires them (a recorded failure fails the
matcher's waiters)."""
from __future__ import annotations

from ..groups.state import GroupStates
from ..transport.base import MessageKey
from ..transport.matching import Matcher


class MatcherCarrier:
    """What the world transport does once GroupStates recorded a failure, for a lone matcher."""

    def __init__(self, matcher: Matcher, rank: int = 0):
        self.matcher = matcher
        self.rank = rank

    def failed_peer(self, peer: int, error: BaseException) -> None:
        self.matcher.fail_source(peer, error)

    def failed_group(self, group: int, error: BaseException) -> None:
        self.matcher.fail_group(group, error)

    def held_calls(self, group: int, seq: int) -> list[tuple[int, MessageKey, int]]:
        return self.matcher.held_calls(group, seq)

    def cut_off(self, peer: int, error: BaseException) -> None:
        """A lone matcher has no connection to hang up."""


def wired_matcher(held_limit: int = 64 << 20) -> Matcher:
    """A Matcher whose ``events`` (a GroupStates) fail its waiters as a world's would."""
    states = GroupStates()
    matcher = Matcher(states, held_limit)
    states.carrier = MatcherCarrier(matcher)
    return matcher
