"""The spin budget a shared-memory Signal learns (issue 40): waits whose writer shares the core
stop burning the whole budget within a few waits; waits whose writer runs elsewhere spin more.

The counter is a fake that counts the waiter's reads and arrives after a given number of them,
or during a yield; time is a fake clock, so a yield is "quick" (ran nothing else) or "slow"
(handed the core away) by construction."""
from __future__ import annotations

import os
import types

import pytest

from pydist.core.deadline import Deadline
from pydist.transport.shm import signal as signal_module
from pydist.transport.shm.segment import anonymous
from pydist.transport.shm.signal import SPIN_FLOOR, SPIN_START, Signal


class _Counter:
    """A Signal's buffer as words: word 0 is the counter the waiter reads, which reaches 1 at
    read ``arrive_at`` (counting from 1; the wait's first look included) or when ``arrive()``
    is called; the other words (the CPUs noted) are plain."""

    def __init__(self):
        self.reads = 0
        self.arrive_at = 0
        self.value = 0
        self.other: dict[int, int] = {}

    def __getitem__(self, index: int) -> int:
        if index:
            return self.other.get(index, 0)
        self.reads += 1
        if self.arrive_at and self.reads >= self.arrive_at:
            self.value = 1
        return self.value

    def __setitem__(self, index: int, value: int) -> None:
        self.other[index] = value

    def arrive(self) -> None:
        self.value = 1


@pytest.fixture
def rig(monkeypatch):
    """(signal, counter, yield_seconds): each os.sched_yield takes yield_seconds[0] of fake
    time and, where yield_arrives[0], lets the writer publish (it shared the core)."""
    memory, base = anonymous(4096)
    signal = Signal(memory.data, base, 64, oversubscribed=False)
    counter = _Counter()
    signal._words = counter
    now = [0.0]
    yield_seconds = [0.0]
    monkeypatch.setattr(signal_module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(signal_module.atomics, "PLAIN_ORDERING", True)

    def sched_yield():
        now[0] += yield_seconds[0]
        counter.arrive()
    monkeypatch.setattr(os, "sched_yield", sched_yield)
    return signal, counter, yield_seconds


def _wait(signal: Signal, counter: _Counter, arrive_at: int = 0) -> int:
    """One wait for a counter that arrives as told; returns the reads it took."""
    counter.reads, counter.value, counter.arrive_at = 0, 0, arrive_at
    signal.wait_at_least(0, 1, Deadline.after(60))
    return counter.reads


def test_a_writer_sharing_the_core_makes_the_waits_stop_spinning_within_a_few(rig):
    """The counter arrives only while the waiter's yield runs something else (the writer):
    each such wait halves the budget down to SPIN_FLOOR. Ten waits spin less in all than
    one wait of the fixed 20,000-spin policy did."""
    signal, counter, yield_seconds = rig
    yield_seconds[0] = 0.001  # the yield handed the core away
    budgets, reads = [], 0
    for _ in range(10):
        reads += _wait(signal, counter)
        budgets.append(signal.spins)
    assert budgets[:3] == [SPIN_START // 2, SPIN_START // 4, SPIN_START // 8]
    assert budgets[-1] == SPIN_FLOOR
    assert reads < 20000


def test_a_writer_running_elsewhere_a_little_late_doubles_the_budget_up_to_its_cap(rig):
    """The counter arrives just after the spin, before any yield, or during yields that ran
    nothing else: the next wait spins twice as long, up to the cap."""
    signal, counter, yield_seconds = rig
    _wait(signal, counter, arrive_at=SPIN_START + 2)  # the first look after the spin
    assert signal.spins == 2 * SPIN_START
    yield_seconds[0] = 0.0  # quick yields
    for _ in range(12):
        _wait(signal, counter, arrive_at=10 ** 9)  # arrives at the first yield
    assert signal.spins == signal.spin_cap == 20000


def test_a_counter_arriving_late_in_the_spin_doubles_the_budget_and_an_early_one_keeps_it(rig):
    signal, counter, _ = rig
    _wait(signal, counter, arrive_at=10)
    assert signal.spins == SPIN_START
    _wait(signal, counter, arrive_at=SPIN_START * 3 // 4)
    assert signal.spins == 2 * SPIN_START


def test_the_budget_comes_back_once_the_writer_moves_to_another_core(rig):
    """At the floor (writer on this core), then the scheduler moves it: quick yields see it."""
    signal, counter, yield_seconds = rig
    yield_seconds[0] = 0.001
    for _ in range(8):
        _wait(signal, counter)
    assert signal.spins == SPIN_FLOOR
    yield_seconds[0] = 0.0
    for _ in range(3):
        _wait(signal, counter)
    assert signal.spins == 8 * SPIN_FLOOR


def test_a_wait_that_sleeps_halves_the_budget(rig, monkeypatch):
    """The writer came after the yield phase: the wait slept (its deadline had passed)."""
    signal, counter, yield_seconds = rig
    monkeypatch.setattr(os, "sched_yield", lambda: None)
    signal_module.time.perf_counter = iter(x * 1e-4 for x in range(10 ** 6)).__next__
    with pytest.raises(signal_module.WaitTimeout):
        signal.wait_at_least(0, 1, Deadline.after(0.0))
    assert signal.spins == SPIN_START // 2


MINE, THEIRS = 1, 2  # the words where the waiter and the writer note their CPU (+1)


@pytest.mark.parametrize("writer_cpu, after", [(5, SPIN_START // 2), (7, 2 * SPIN_START), (None, SPIN_START)])
def test_which_cpu_the_writer_was_noted_on_tells_whether_to_spin_shorter_or_longer(rig, monkeypatch, writer_cpu,
                                                                                  after):
    """The counter came during a yield that ran something else: the writer on this CPU (5):
    halve; on another (7): something else took the core, a longer spin keeps it: double;
    unknown: keep. The waiter notes its own CPU for the writer to read."""
    signal, counter, yield_seconds = rig
    monkeypatch.setattr(signal_module.atomics, "current_cpu", lambda: 5)
    yield_seconds[0] = 0.001
    if writer_cpu is not None:
        counter.other[THEIRS] = writer_cpu + 1
    counter.reads, counter.value, counter.arrive_at = 0, 0, 0
    signal.wait_at_least(0, 1, Deadline.after(60), cpus=(MINE, THEIRS))
    assert signal.spins == after
    assert counter.other[MINE] == 6


def test_an_oversubscribed_machine_keeps_its_short_spin():
    memory, base = anonymous(4096)
    signal = Signal(memory.data, base, 64, oversubscribed=True)
    assert signal.spins == signal.spin_cap == signal.spin_floor == 30


class _Neighbours:
    """cpus.Neighbours saying ``busy`` at every look; ``looks``: the yields' lengths it was given."""

    busy_says = False

    def __init__(self, ranks_here: int):
        self.ranks_here, self.looks = ranks_here, []

    @classmethod
    def saying(cls, busy: bool) -> type:
        return type("Saying", (cls,), {"busy_says": busy})

    def busy(self, took: float) -> bool:
        self.looks.append(took)
        return self.busy_says


def _yields_of_a_missed_wait(signal: Signal, yields: list) -> int:
    """Yields of one wait whose counter never comes (its deadline has passed: after the yield
    phase it raises instead of sleeping)."""
    before = len(yields)
    with pytest.raises(signal_module.WaitTimeout):
        signal.wait_at_least(0, 1, Deadline.after(0.0))
    return len(yields) - before


@pytest.mark.parametrize("oversubscribed", [True, False])
def test_a_yield_that_ran_a_busy_process_makes_oversubscribed_waits_sleep_for_a_while(monkeypatch, oversubscribed):
    """A yield that took a scheduler slice (5 ms) while more tasks ran than the job's ranks
    here handed the core to a busy process: with more ranks than cores, the waits of the
    next SKIP_YIELDS_SECONDS sleep after their spin instead of yielding again; then one
    tries. With a core per rank nothing changes."""
    memory, base = anonymous(4096)
    monkeypatch.setattr(signal_module, "Neighbours", _Neighbours.saying(True))
    signal = Signal(memory.data, base, 64, oversubscribed=oversubscribed, ranks_here=4)
    signal._words = _Counter()
    now, yields = [0.0], []
    monkeypatch.setattr(signal_module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(signal_module.atomics, "PLAIN_ORDERING", True)

    def busy_slice():
        yields.append(now[0])
        now[0] += 0.005
    monkeypatch.setattr(os, "sched_yield", busy_slice)
    assert _yields_of_a_missed_wait(signal, yields) == 1  # the slice ends the yield phase (YIELD_SECONDS)
    now[0] += 0.01
    skipped = _yields_of_a_missed_wait(signal, yields)
    now[0] += signal_module.SKIP_YIELDS_SECONDS
    assert (skipped, _yields_of_a_missed_wait(signal, yields)) == ((0, 1) if oversubscribed else (1, 1))


def test_a_long_yield_among_ranks_alone_keeps_the_waits_yielding(monkeypatch):
    """No more runnable tasks than the job's ranks here: a long yield ran other ranks (8 on 2
    cores), and the waits go on yielding."""
    memory, base = anonymous(4096)
    monkeypatch.setattr(signal_module, "usable_cpus", lambda: 2)
    monkeypatch.setattr(signal_module, "Neighbours", _Neighbours.saying(False))
    signal = Signal(memory.data, base, 64, oversubscribed=True, ranks_here=8)
    signal._words = _Counter()
    now, yields = [0.0], []
    looked = signal._neighbours.looks
    monkeypatch.setattr(signal_module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(signal_module.atomics, "PLAIN_ORDERING", True)

    def long_yield():
        yields.append(now[0])
        now[0] += 0.005
    monkeypatch.setattr(os, "sched_yield", long_yield)
    assert [_yields_of_a_missed_wait(signal, yields) for _ in range(2)] == [1, 1]
    assert looked == [0.005]  # within LOOK_SECONDS of the first look: what it saw
    now[0] += signal_module.LOOK_SECONDS
    assert _yields_of_a_missed_wait(signal, yields) == 1
    assert looked == pytest.approx([0.005, 0.005])


def test_many_ranks_per_core_never_skip_yields(monkeypatch):
    """Past BUSY_RULE_RANKS_PER_CORE the ranks' own threads outnumber them: no looks at all."""
    memory, base = anonymous(4096)
    monkeypatch.setattr(signal_module, "usable_cpus", lambda: 2)
    signal = Signal(memory.data, base, 64, oversubscribed=True, ranks_here=32)
    assert signal._ranks_here == 0 and signal._neighbours is None
