"""Waiting for counters in shared memory: spin, then yield, then sleep on a futex.

A Signal is a doorbell word, a sleepers word and a pollers word in shared memory, shared by
a set of monotonically increasing 64-bit counters. ``publish`` stores a counter and, only when
someone sleeps, rings the doorbell; ``wait_at_least`` spins on the counter briefly (long
when every rank has a core of its own, short when ranks outnumber cores, so that 4-8 ranks
on 2 cores do not starve the rank they wait for), yields the CPU, then sleeps on the
doorbell futex in slices of at most SLEEP_SLICE seconds, checking the deadline and a
liveness callback between slices. The sleeps are timed waits on pydist's clock
(``Deadline.wait``), so a fake clock lets an arena's timeout pass at once.

Ordering: the store of a counter is a sequentially consistent exchange, then the sleepers
word is read; a sleeper increments the sleepers word (sequentially consistent), reads the
doorbell, re-reads the counter and sleeps only while the doorbell is unchanged. Whichever
goes first, the sleeper either sees the counter or is woken (the futex syscall orders the
rest), so no wake-up is lost. Data written before ``publish`` is visible to a waiter after
``wait_at_least`` returns (release/acquire).

The yield phase is bounded in time (YIELD_SECONDS) as well as in count: a yield hands the core
to whatever else is runnable, and where that is not a rank but a busy process (a data loader's
workers, another job) each yield costs up to a scheduler slice. 2 ranks on 2 cores beside 2
busy processes, 512 B to 4 KiB all_reduce: 2.4 ms a call after 50 yields (gloo 0.9-2.2 ms),
31-38 us bounded (gloo 0.7-1.1 ms); 4 ranks beside them 7.8 ms -> 4.0 ms (gloo 11 ms). Alone
the count ends the phase first, as before: 4 ranks on 2 cores, where the yields hand the
core to the rank waited for, and 2 ranks, 4 B to 64 MiB, within the runs' noise.

A yield that took longer than LONG_YIELD handed the core to something that ran a whole
scheduler slice. Where busy processes run beside the job (``cpus.Neighbours``: more tasks
runnable than the job has ranks here, where the job is the whole host; else this cgroup's
CPU pressure, or no look at all), that was a busy process: yields then only cost slices,
while a futex sleeper is woken at once when its counter comes (the scheduler favours a task
that slept over one that ran), so the waits of the next SKIP_YIELDS_SECONDS skip yielding
and sleep after their spin; then one tries again. Only where ranks outnumber cores (their
spin is short). Measured on 2 cores, a barrier then a 4 B all_reduce per call:
- 4 ranks beside 2 busy processes: 0.85-0.95 ms a call yielding, 0.17-0.47 ms sleeping;
  alone, sleeping at once was slower (0.12-0.19 ms, 0.05-0.11 yielding);
- 8 ranks alone, where a few yields in a thousand take 1-10 ms running other ranks:
  sleeping after each long yield 0.46-0.50 ms, not sleeping 0.40-0.42; with the count,
  within the noise (0.37-0.48, 0.30-0.43 ms). The count errs where a rank's own thread
  runs too (9 to 11 runnable of 8 ranks in 1 look in 5); requiring two looks in a row
  lost most of the gain beside busy processes (0.51-0.85 ms);
- ranks with a core each keep their learnt spin instead: 2 ranks beside 2 busy
  processes took 17 us a call, and 60-130 us with this rule (the budget learnt down to
  sleeping).

The spin budget is learnt per Signal (``spins``, between SPIN_FLOOR and the cap above): a
spin is worth it only while the writer runs on another core. Where it shares this core (two
ranks the scheduler put on one CPU: right after start-up until its load balancer moves one,
and for good beside busy processes), the writer cannot run while the waiter spins, so every
wait burnt the whole budget (20,000 spins, ~0.6-1 ms) before yielding the core to it: 2 ranks
on 2 cores beside 2 busy processes took ~1 ms a call for the first ~50 calls, then 7 us once
the ranks ran apart; 16 ranks on 16 cores 1.4 ms, then 49 us (issue 40; tools/transient.py
counts it: pinned to one CPU, 15,000-18,000 spins a call). So a wait that ends only after
the waiter gave its core away halves the budget, and one whose counter came late in the
spin, or during yields that ran nothing else (the writer runs elsewhere, a little slower),
doubles it: a few calls move it either way. Which core the writer is on tells the two
cases of a yield that ran something else apart: with ``cpus`` (word indices: where this
waiter and the writer note the CPU they last ran a slow wait on, +1; 0 unknown), a counter
that came while the writer was noted on this CPU halves the budget, one noted elsewhere (a
busy process took this core; a longer spin would have kept it) doubles it, and an unknown
one keeps it. Without ``cpus`` such a wait halves it.

``ring`` skips the futex wake while a thread of the owner polls what the ring announces
(``polling``): waking a sleeping thread of a process whose other thread is already reading
only makes the two fight for that process's GIL. The poller, on leaving, re-checks for
work and rings itself; the ringer bumps the doorbell (a locked add) before reading the
pollers word, the poller leaves with a locked add before re-checking, so one of them sees
the other. On x86-64 a ring without sleepers is a fence and two plain reads (see
_atomics.fence); the doorbell is bumped only for a sleeper, which counted itself in with a
locked add before re-checking, so again one of the two sees the other.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from functools import partial

from ...core.deadline import Deadline
from . import atomics
from .cpus import Neighbours, usable_cpus

SLEEP_SLICE = 0.05
#: Seconds a waiter yields the CPU (after spinning) before it sleeps on the futex.
YIELD_SECONDS = 0.0003
#: Spins a new Signal's waits start with (~60 us in CPython) and the fewest it learns down to
#: (~7 us: a writer running on another core usually arrives within that), unless the cap
#: (the spins of a machine with more ranks than cores) is lower.
SPIN_START = 2048
SPIN_FLOOR = 256
#: A yield that returns within this many seconds ran nothing else on this core.
QUICK_YIELD = 0.00001
#: A yield that returns after this many seconds handed the core to something that ran a whole
#: scheduler slice (a busy process, not a rank): yielding is then skipped for SKIP_YIELDS_SECONDS.
LONG_YIELD = 0.001
SKIP_YIELDS_SECONDS = 0.05
LOOK_SECONDS = 0.01
#: The rule holds up to this many ranks per core (measured helping at 2, neutral at 4, and
#: slowing 32 ranks on 2 cores down 1.5-3x: 1.6-3.8 -> 3.9-7.3 ms a call).
BUSY_RULE_RANKS_PER_CORE = 4


class WaitTimeout(Exception):
    """The deadline passed before the counter reached its target."""


class Signal:
    """Doorbell + sleepers + pollers at ``offset`` (12 bytes) of a shared buffer whose base
    address is ``base``."""

    def __init__(self, memory: memoryview, base: int, offset: int, oversubscribed: bool, ranks_here: int = 0):
        """``ranks_here``: the job's ranks on this machine (0: unknown), which an oversubscribed
        wait tells from busy processes (see LONG_YIELD)."""
        self._words = memory.cast("Q")  # the whole buffer as 64-bit words
        self._halves = memory.cast("I")
        self._base = base
        self._doorbell = base + offset
        self._sleepers = base + offset + 4
        self._sleepers_index = (offset + 4) // 4
        self._pollers = base + offset + 8
        self._pollers_index = (offset + 8) // 4
        self._counting = threading.Lock()
        self.spin_cap, self.yields = (30, 300) if oversubscribed else (20000, 50)
        self.spin_floor = min(SPIN_FLOOR, self.spin_cap)
        self.spins = min(SPIN_START, self.spin_cap)  # learnt by the waits (see the module docstring)
        # oversubscribed, a few ranks per core: a long yield beside busy processes makes the
        # waits skip yielding until _yield_again (see LONG_YIELD)
        # (cores: the CPUs this process may use, cpus.usable_cpus, read only where it matters)
        crowded = oversubscribed and ranks_here <= BUSY_RULE_RANKS_PER_CORE * usable_cpus()
        self._ranks_here = ranks_here if crowded else 0
        self._neighbours = Neighbours(ranks_here) if crowded else None
        self._yield_again = 0.0
        self._busy_seen = (-1.0, False)  # (when, what) the neighbours said last (see _busy_beside)

    def address(self, index: int) -> int:
        return self._base + 8 * index

    def read(self, index: int) -> int:
        """Counter ``index`` (in 64-bit words from the buffer start), with acquire order."""
        if atomics.PLAIN_ORDERING:
            return self._words[index]
        return atomics.load_u64_acquire(self._base + 8 * index)

    def publish(self, index: int, value: int) -> None:
        """Set counter ``index`` to ``value`` and wake sleepers, if any."""
        if atomics.PLAIN_ORDERING:  # store_seq_cst and _sleeping written out: the latency path's every sync
            self._words[index] = value
            with atomics.FENCE:
                pass
            sleeping = self._halves[self._sleepers_index]
        else:
            atomics.store_seq_cst(self._words, self._base, index, value)
            sleeping = self._sleeping()
        if sleeping:
            atomics.fetch_add_u32(self._doorbell, 1)
            atomics.futex_wake(self._doorbell)

    def ring(self) -> None:
        """Wake sleepers without changing a counter (something else they watch changed,
        stored before), unless a poller will see the change."""
        if atomics.PLAIN_ORDERING:  # the change, then the words: a fence, and no doorbell without sleepers
            atomics.fence()
            if self._halves[self._sleepers_index] and not self._halves[self._pollers_index]:
                atomics.fetch_add_u32(self._doorbell, 1)
                atomics.futex_wake(self._doorbell)
            return
        atomics.fetch_add_u32(self._doorbell, 1)
        if self._sleeping() and not self._halves[self._pollers_index]:
            atomics.futex_wake(self._doorbell)

    def wake(self) -> None:
        """Ring and wake the sleepers even while someone polls (stopping a sleeper)."""
        atomics.fetch_add_u32(self._doorbell, 1)
        if self._sleeping():
            atomics.futex_wake(self._doorbell)

    def polling(self, delta: int) -> int:
        """Count a poller of the owning process in (+1) or out (-1); returns the pollers
        left. A full barrier: what is read after it was written after the count."""
        if not atomics.PLAIN_ORDERING:
            return atomics.fetch_add_u32(self._pollers, delta) + delta
        with self._counting:  # only the owner's threads count: a process-local lock suffices
            count = self._halves[self._pollers_index] = self._halves[self._pollers_index] + delta
        atomics.fence()
        return count

    def _sleeping(self) -> int:
        """Sleepers now; called right after a sequentially consistent write (x86: a plain load
        cannot pass the locked instruction before it)."""
        if atomics.PLAIN_ORDERING:
            return self._halves[self._sleepers_index]
        return atomics.load_u32_seq_cst(self._sleepers)

    def wait_at_least(self, index: int, target: int, deadline: Deadline,
                      alive: Callable[[], None] | None = None, cpus: tuple[int, int] | None = None) -> None:
        """Return once counter ``index`` >= ``target``; WaitTimeout at the deadline. ``alive()``
        is called between sleeps and may raise (a dead peer). ``cpus``: see the module docstring."""
        words = self._words
        if words[index] >= target and atomics.PLAIN_ORDERING:
            return
        spins = self.spins
        for spun in range(spins):
            if words[index] >= target:
                if spun >= spins >> 1:  # late in the spin: a longer one would catch the next wait too
                    self.spins = min(spins << 1, self.spin_cap)
                return self._acquire(index)
        cpu = 0
        if cpus is not None:  # noted before yielding: a writer waiting on this rank's next counter reads it
            cpu = words[cpus[0]] = atomics.current_cpu() + 1
        now = time.perf_counter()  # real time: it bounds the CPU handed away
        until, quick = now + YIELD_SECONDS, True
        for _ in range(self.yields if now >= self._yield_again else 0):
            if words[index] >= target:
                self._learn(spins, True if quick else self._other_core(cpu, cpus))
                return self._acquire(index)
            now = time.perf_counter()
            if now > until:
                break
            os.sched_yield()
            took = time.perf_counter() - now
            quick = quick and took < QUICK_YIELD
            if took > LONG_YIELD and self._ranks_here and self._busy_beside(now, took):
                self._yield_again = now + took + SKIP_YIELDS_SECONDS  # a busy process took the core: sleep
                break
        self._learn(spins, False)
        self._sleep_until(index, target, deadline, alive)

    def _busy_beside(self, now: float, took: float) -> bool:
        """Whether busy processes took the core during a yield of ``took`` seconds
        (``Neighbours.busy``), looked at most once per LOOK_SECONDS: at 32 ranks on 2 cores
        most yields are long, and reading /proc/loadavg at each made calls 1.5-2x slower."""
        when, busy = self._busy_seen
        if now - when >= LOOK_SECONDS and self._neighbours is not None:
            busy = self._neighbours.busy(took)
            self._busy_seen = (now, busy)
        return busy

    def _other_core(self, cpu: int, cpus: tuple[int, int] | None) -> bool | None:
        """After a yield that ran something else: was the writer noted on another CPU than
        this waiter's (``cpu``, +1)? None where either is unknown; False without ``cpus``."""
        if cpus is None:
            return False
        theirs = self._words[cpus[1]]
        if not theirs or not cpu:
            return None
        return theirs != cpu

    def _learn(self, spins: int, longer: bool | None) -> None:
        """After a wait that outlasted ``spins``: spin twice as long (``longer``: the writer
        runs on another core and came soon after, or this core was taken by something else
        than the writer), half as long (False: the writer may share this core, spinning
        only delays it), or as long (None)."""
        if longer is not None:
            self.spins = min(spins << 1, self.spin_cap) if longer else max(spins >> 1, self.spin_floor)

    def sleep(self, ready: Callable[[], bool], timeout: float) -> None:
        """Sleep until the doorbell rings or ``timeout`` passes, unless ``ready()`` already
        (checked after announcing the sleep, so a ring between the two is not lost)."""
        atomics.fetch_add_u32(self._sleepers, 1)
        try:
            bell = atomics.load_u32_seq_cst(self._doorbell)
            if not ready():
                atomics.futex_wait(self._doorbell, bell, timeout)
        finally:
            atomics.fetch_add_u32(self._sleepers, -1)

    def _acquire(self, index: int) -> None:
        if not atomics.PLAIN_ORDERING:
            atomics.load_u64_acquire(self._base + 8 * index)

    def _sleep_until(self, index: int, target: int, deadline: Deadline, alive) -> None:
        atomics.fetch_add_u32(self._sleepers, 1)
        try:
            while True:
                bell = atomics.load_u32_seq_cst(self._doorbell)
                if self.read(index) >= target:
                    return
                if alive is not None:
                    try:
                        alive()  # only consulted while the counter is short: a peer may leave once done
                    except BaseException:
                        if self.read(index) >= target:  # it did its part just before it left
                            return
                        raise
                if deadline.expired():
                    raise WaitTimeout
                deadline.wait(partial(self._nap, bell))  # on the current clock (a fake one may jump)
        finally:
            atomics.fetch_add_u32(self._sleepers, -1)

    def _nap(self, bell: int, seconds: float | None) -> bool:
        """One futex sleep while the doorbell reads ``bell``, of at most SLEEP_SLICE (and
        ``seconds``): a blocking primitive's wait for ``Deadline.wait``, True once it rang."""
        atomics.futex_wait(self._doorbell, bell, SLEEP_SLICE if seconds is None else min(seconds, SLEEP_SLICE))
        return atomics.load_u32_seq_cst(self._doorbell) != bell
