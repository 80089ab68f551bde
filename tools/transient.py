"""The start-up transient of small all_reduce (issue 40): per-call-range times and wait counters.

Runs N ranks as processes (pydist.testing.run_processes, shared memory unless PYDIST_SHM=0),
each doing CALLS x 4 B all_reduce straight after init_process_group, and prints, per range
of call indices (1, 2-10, 11-50, 51-100, 101-300), the slowest rank's time per call (the
maximum over ranks of each call's time, averaged over the range) and, per call summed over
ranks: waits (Signal.wait_at_least), spins (iterations of a wait's spin loop), yields
(os.sched_yield), futex sleeps (atomics.futex_wait), store requests (TCPStore._request),
voluntary and involuntary context switches of the calling thread, CPU moves between calls,
the spin budget the last wait's Signal holds after the call; last, the share of calls after
which two ranks had last run on one CPU. The counters come from wrapping those functions in
each rank process (which slows the spins: compare times with --no-counters).

    .venv/bin/python tools/transient.py --ranks 2 --runs 6 [--busy 2] [--pin same|apart]

``--busy K`` starts K busy processes (``while True: pass``) beside the ranks for the runs
and kills them (by pid) afterwards: the contended case of the issue. To compare with an
older tree, run it with PYTHONPATH=<that tree>/src, alternating with the current one.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable

RANGES = [(1, 1), (2, 10), (11, 50), (51, 100), (101, 300), (301, 10**9)]
COUNTERS = ("waits", "spins", "yields", "futex", "store", "nvcsw", "nivcsw", "moves", "budget")
WIDTH = 44
MEASURED = 5  # the first COUNTERS are counted by wrappers, the rest read from the kernel
SNAPSHOTS = (0, 1, 10, 50, 100, 300)  # thread CPU times are taken after these many calls


def _instrument(counts: dict[str, int], used: list) -> None:
    """Count waits, yields, futex sleeps and store requests in this process; ``used`` gets
    the Signal waited on last (its learnt spin budget is read after each call)."""
    from pydist.store.tcp import TCPStore
    from pydist.transport.shm import atomics, signal

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    wait_at_least = counted("waits", signal.Signal.wait_at_least)

    def noted(self, *args, **kwargs):
        used[:] = [self]
        return wait_at_least(self, *args, **kwargs)
    signal.Signal.wait_at_least = noted

    def counting_range(*args):  # the spin loop's iterations (the first range of a wait; yields apart)
        for i in range(*args):
            if args[-1] not in (50, 300):  # Signal's yield counts
                counts["spins"] += 1
            yield i
    signal.range = counting_range
    atomics.futex_wait = counted("futex", atomics.futex_wait)
    os.sched_yield = counted("yields", os.sched_yield)
    TCPStore._request = counted("store", TCPStore._request)


def _cpu() -> int:
    """The CPU this thread last ran on (field 39 of /proc/thread-self/stat)."""
    with open("/proc/thread-self/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[36])


def _thread_cpu_us() -> dict[str, int]:
    """CPU time of each Python thread of this process, in microseconds."""
    return {t.name: time.clock_gettime_ns(time.pthread_getcpuclockid(t.ident)) // 1000
            for t in threading.enumerate() if t.ident is not None}


def _profiled(call: Callable[[], None], seen: dict[str, int]) -> None:
    """Run ``call`` counting every Python and C function it calls (main thread only) into ``seen``."""
    def count(frame, event, arg):
        if event == "call":
            code = frame.f_code
            key = f"{os.path.basename(code.co_filename)}:{code.co_name}"
        elif event == "c_call":
            key = f"C:{getattr(arg, '__qualname__', arg)}"
        else:
            return
        seen[key] = seen.get(key, 0) + 1
    sys.setprofile(count)
    try:
        call()
    finally:
        sys.setprofile(None)


def _pin(rank: int, size: int, how: str) -> None:
    """Pin this rank: "same": every rank on CPU 0; "apart": rank r on CPU r % cores."""
    cores = sorted(os.sched_getaffinity(0))
    if how == "same":
        os.sched_setaffinity(0, {cores[0]})
    elif how == "apart":
        os.sched_setaffinity(0, {cores[rank % len(cores)]})


def _fix_spins() -> None:
    """The wait policy before issue 40: every wait spins the whole cap (20,000) first."""
    from pydist.transport.shm import signal
    wait_at_least = signal.Signal.wait_at_least

    def fixed(self, *args, **kwargs):
        self.spins = getattr(self, "spin_cap", self.spins)
        return wait_at_least(self, *args, **kwargs)
    signal.Signal.wait_at_least = fixed


def rank_main(rank: int, size: int, calls: int, instrument: bool, profile: bool = False, pin: str = "",
              fixed: bool = False):
    """After init: ``calls`` x 4 B all_reduce; (each call's ns, each call's counter deltas,
    thread CPU snapshots)."""
    import numpy as np

    import pydist
    counts = dict.fromkeys(COUNTERS, 0)
    used: list = []
    if fixed:
        _fix_spins()
    if instrument:
        _instrument(counts, used)
    buf = np.zeros(1, dtype=np.float32)
    times, deltas, snapshots = [], [], {0: _thread_cpu_us()}
    functions: list[dict[str, int]] = []
    clock = time.perf_counter_ns
    _pin(rank, size, pin)
    cpu = _cpu()
    cpus = []
    for call in range(1, calls + 1):
        before = tuple(counts[c] for c in COUNTERS[:MEASURED])
        usage = resource.getrusage(resource.RUSAGE_THREAD)
        start = clock()
        if profile:
            functions.append({})
            _profiled(lambda: pydist.all_reduce(buf), functions[-1])
        else:
            pydist.all_reduce(buf)
        times.append(clock() - start)
        after = resource.getrusage(resource.RUSAGE_THREAD)
        now = _cpu()
        deltas.append(tuple(counts[c] - b for c, b in zip(COUNTERS, before))
                      + (after.ru_nvcsw - usage.ru_nvcsw, after.ru_nivcsw - usage.ru_nivcsw, int(now != cpu),
                         used[0].spins if used else 0))
        cpu = now
        cpus.append(now)
        if call in SNAPSHOTS:
            snapshots[call] = _thread_cpu_us()
    return times, deltas, snapshots, functions, cpus



def one_run(ranks: int, calls: int, instrument: bool, profile: bool = False, pin: str = "",
            fixed: bool = False) -> list:
    from pydist.testing import run_processes
    return run_processes(ranks, rank_main, calls, instrument, profile, pin, fixed, timeout=300)


def table(results, calls: int) -> list[tuple[str, float, list[float]]]:
    """Per range: (label, slowest rank's us per call, counters per call summed over ranks)."""
    rows = []
    for lo, hi in RANGES:
        hi = min(hi, calls)
        if lo > hi:
            continue
        idx = range(lo - 1, hi)
        slowest = sum(max(r[0][i] for r in results) for i in idx) / len(idx) / 1000
        counters = [sum(r[1][i][c] for r in results for i in idx) / len(idx) for c in range(len(COUNTERS))]
        # the share of calls after which some rank last ran on the same CPU as another
        shared = sum(len({r[4][i] for r in results}) < len(results) for i in idx) / len(idx)
        rows.append((f"{lo}" if lo == hi else f"{lo}-{hi}", slowest, counters + [shared]))
    return rows


def _print_threads(results) -> None:
    """Each rank's threads' CPU microseconds between the snapshots (init->call 1, 1-10, ...)."""
    for rank, (_, _, snaps, _, _) in enumerate(results):
        points = sorted(snaps)
        for name in snaps[points[-1]]:
            spent = [snaps[b].get(name, 0) - snaps[a].get(name, 0) for a, b in zip(points, points[1:])]
            print(f"     rank {rank} {name:<28} cpu us per span {points}: {spent}")


def _print_functions(results, calls: int) -> None:
    """Functions whose calls per all_reduce differ between ranges (profile mode), per rank."""
    spans = [(lo, min(hi, calls)) for lo, hi in RANGES if lo <= calls]
    for rank, result in enumerate(results):
        per_call = result[3]
        names = sorted({name for seen in per_call for name in seen})
        for name in names:
            means = [sum(per_call[i].get(name, 0) for i in range(lo - 1, hi)) / (hi - lo + 1) for lo, hi in spans]
            if max(means) - min(means[1:] or means) > 0.2 * max(means) and max(means[1:] or means) > 0.05:
                print(f"     rank {rank} {name:<50} " + " ".join(f"{m:9.1f}" for m in means))


def _cell(us: float, counters: list[float], bare: bool) -> str:
    return f"{us:7.0f}" if bare else f"{us:7.0f} " + "/".join(f"{c:.3g}" for c in counters)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--busy", type=int, default=0, help="busy processes beside the ranks")
    parser.add_argument("--no-counters", action="store_true", help="do not wrap anything (pure timing)")
    parser.add_argument("--threads", action="store_true", help="print each rank's threads' CPU time per range")
    parser.add_argument("--pin", choices=("same", "apart"), default="",
                        help="after init, pin every rank to one CPU (same) or each to its own (apart)")
    parser.add_argument("--compare", action="store_true",
                        help="each run twice, alternating which goes first: the learnt spin budget (new) and "
                             "the fixed one of before issue 40 (old, every wait spins 20,000 first)")
    parser.add_argument("--profile", action="store_true",
                        help="count the functions each call runs; print those whose count differs between ranges")
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        print(f"{args.ranks} ranks, {args.calls} x 4 B all_reduce after init, {args.busy} busy processes, "
              f"PYDIST_SHM={os.environ.get('PYDIST_SHM', '(default)')}, pin={args.pin or 'no'}; "
              "per call: slowest rank's us; "
              f"{'/'.join(COUNTERS)} summed over ranks, share of calls with 2 ranks on one CPU")
        width = 9 if args.no_counters else WIDTH
        header = "run     " + "".join(f"{label:>{width}}" for label in
                                   [f"{lo}" if lo == hi else f"{lo}-{min(hi, args.calls)}"
                                    for lo, hi in RANGES if lo <= args.calls])
        print(header)
        for run in range(args.runs):
            arms = [("new", False), ("old", True)] if args.compare else [("", False)]
            for label, fixed in arms if run % 2 == 0 else arms[::-1]:
                results = one_run(args.ranks, args.calls, not args.no_counters, args.profile, args.pin, fixed)
                rows = table(results, args.calls)
                cells = "".join(f"{_cell(us, counters, args.no_counters):>{width}}" for _, us, counters in rows)
                print(f"{f'{run + 1} {label}':<8}{cells}", flush=True)
                if args.threads:
                    _print_threads(results)
                if args.profile:
                    _print_functions(results, args.calls)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
