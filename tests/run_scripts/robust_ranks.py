"""Rank programs and a harness for tests/test_robustness_quick.py and tests/test_robustness_soak.py.

Imported (not run as a script) as ``run_scripts.robust_ranks``: tests/ is on sys.path (pyproject's
pytest ``pythonpath``), and forkserver children inherit it, so they unpickle the rank functions
by module name.

- :func:`plan` draws operation ``i`` of a random sequence from ``(seed, i)`` alone, so every
  rank draws the same sequence; :func:`run_op` runs it on this rank and returns the outputs,
  :func:`check_op` compares them with the naive reference (``pydist.testing.reference``:
  small integers, exact in every dtype and every reduction order).
- :func:`soak_rank` runs ``n`` such operations and reports RSS / threads / descriptors at
  the start, after ``mark`` operations and at the end, and what is left after
  ``destroy_process_group``.
- :func:`kill_trial` starts ``size`` ranks looping over random operations, SIGKILLs one of
  them (by pid) at a random moment and reports, for every survivor, how long it took to
  raise, what it raised, and how long ``destroy_process_group`` took afterwards.
"""
from __future__ import annotations

import gc
import os
import queue
import random
import re
import signal
import statistics
import threading
import time
from datetime import timedelta
from typing import Any, NamedTuple

import numpy as np

import pydist as dist
from pydist.core.ops import RedOpType
from pydist.testing import free_port, stop_processes
from pydist.testing.processes import _CONTEXT
from pydist.testing.reference import make_op, reduced, supports, value

KINDS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "barrier", "sendrecv")
DTYPES = ("bool", "int8", "uint8", "int16", "int32", "uint32", "int64", "float16", "float32", "float64",
          "complex64", "complex128")
OPS = tuple(RedOpType)
MAX_BYTES = 64 * 1024
#: The group timeout of a SIGKILL trial's ranks (kill_trial_rank).
GROUP_TIMEOUT_S = 30.0
#: Seconds after the kill within which each survivor must raise (violations' default): well
#: before the group timeout, so an exception in time came from detecting the death, not from
#: the timeout. Generous, because a loaded machine can stall a process for seconds; how fast
#: detection is (at worst 2 s on an idle machine, SOAK_DETECT_S) is the soak's to check
#: (tests/test_robustness_soak.py), where the machine is left to it.
DETECT_BOUND_S = 20.0
SOAK_DETECT_S = 2.0
#: A survivor that has not raised this long after the kill is a hang (kill_trial's default).
HANG_S = 25.0


class Spec(NamedTuple):
    """One operation of the random sequence."""

    kind: str
    dtype: str
    count: int      # elements per rank (per chunk for reduce_scatter / all_to_all)
    op: RedOpType   # for the reductions
    root: int       # broadcast's source
    shift: int      # sendrecv: rank r sends to r + shift, receives from r - shift


def plan(seed: int, i: int, size: int, kinds: tuple[str, ...] = KINDS, max_bytes: int = MAX_BYTES,
         min_bytes: int = 1) -> Spec:
    """Operation ``i`` of sequence ``seed`` (the same on every rank): a kind (of ``kinds``), a
    dtype, a size log-uniform in ``min_bytes`` .. ``max_bytes``, a reduce op valid for the
    dtype, a root, a shift."""
    rng = random.Random(seed * 1_000_003 + i)
    kind = rng.choice(kinds)
    dtype = rng.choice(DTYPES)
    nbytes = min(max_bytes, int(2 ** rng.uniform(np.log2(min_bytes), np.log2(max_bytes))))
    count = max(1, nbytes // np.dtype(dtype).itemsize)
    op = rng.choice([op for op in OPS if supports(op, dtype)])
    return Spec(kind, dtype, count, op, rng.randrange(size), 1 + rng.randrange(max(1, size - 1)))


def _input(rank: int, spec: Spec, salt: int) -> np.ndarray:
    return value(rank, spec.count, spec.dtype, salt, for_product=spec.op == RedOpType.PRODUCT)


#: When this process last called into pydist (after making that call's inputs, which can take
#: seconds for 16 MiB buffers on a loaded machine): a survivor's detection time counts from it
#: when the kill came earlier (see kill_trial).
CALLED_AT = [0.0]


def _called(value: Any = None) -> Any:
    CALLED_AT[0] = time.monotonic()
    return value


def run_op(rank: int, size: int, spec: Spec, i: int) -> Any:
    """Run ``spec`` (operation number ``i``) on this rank; the outputs to check."""
    kind = spec.kind
    if kind == "all_reduce":
        t = _input(rank, spec, i)
        dist.all_reduce(_called(t), op=make_op(spec.op))
        return t
    if kind == "broadcast":
        t = _input(rank, spec, i)
        dist.broadcast(_called(t), src=spec.root)
        return t
    if kind == "all_gather":
        out = [np.empty(spec.count, spec.dtype) for _ in range(size)]
        dist.all_gather(out, _called(_input(rank, spec, i)))
        return out
    if kind == "reduce_scatter":
        out = np.empty(spec.count, spec.dtype)
        dist.reduce_scatter(out, _called([_input(rank, spec, i * 8 + j) for j in range(size)]), op=make_op(spec.op))
        return out
    if kind == "all_to_all":
        out = [np.empty(spec.count, spec.dtype) for _ in range(size)]
        dist.all_to_all(out, _called([_input(rank, spec, i * 8 + j) for j in range(size)]))
        return out
    if kind == "barrier":
        dist.barrier(_called())
        return None
    # sendrecv: a ring shifted by spec.shift; the isend first, so no ordering can deadlock
    if size == 1:
        return None
    out = np.empty(spec.count, spec.dtype)
    work = dist.isend(_called(_input(rank, spec, i)), dst=(rank + spec.shift) % size)
    dist.recv(out, src=(rank - spec.shift) % size)
    work.wait()
    return out


def expected(rank: int, size: int, spec: Spec, i: int) -> Any:
    """What :func:`run_op` must return, computed naively from every rank's input."""
    kind, count, dtype, product = spec.kind, spec.count, spec.dtype, spec.op == RedOpType.PRODUCT
    if kind == "all_reduce":
        return reduced(size, count, dtype, spec.op, salt=i)
    if kind == "broadcast":
        return value(spec.root, count, dtype, i, product)
    if kind == "all_gather":
        return [value(j, count, dtype, i, product) for j in range(size)]
    if kind == "reduce_scatter":
        return reduced(size, count, dtype, spec.op, salt=i * 8 + rank)
    if kind == "all_to_all":
        return [value(j, count, dtype, i * 8 + rank, product) for j in range(size)]
    if kind == "barrier" or size == 1:
        return None
    return value((rank - spec.shift) % size, count, dtype, i, product)


def check_op(rank: int, size: int, spec: Spec, i: int, got: Any) -> str | None:
    """None if ``got`` is right, else a description of the difference."""
    want = expected(rank, size, spec, i)
    if want is None:
        return None if got is None else f"op {i} {spec}: expected nothing, got {got!r}"
    pairs = list(zip(got, want)) if isinstance(want, list) else [(got, want)]
    for j, (g, w) in enumerate(pairs):
        if g.dtype != w.dtype or g.shape != w.shape or not np.array_equal(g, w):
            return f"rank {rank} op {i} {spec} part {j}: got {g[:8]!r}..., expected {w[:8]!r}..."
    return None


# -- resource probes --------------------------------------------------------------------------
def rss_kib() -> int:
    """This process's resident set size (VmRSS of /proc/self/status), in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def descriptors() -> dict[int, str]:
    """This process's open file descriptors and what they point to."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the descriptor listdir itself used, closed since
            pass
    return out


def probe() -> dict[str, Any]:
    """RSS (KiB), OS threads, Python threads named pydist-*, descriptors."""
    return {"rss_kib": rss_kib(), "os_threads": len(os.listdir("/proc/self/task")),
            "pydist_threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("pydist-")),
            "fds": descriptors(), "time": time.monotonic()}


# -- the soak -----------------------------------------------------------------------------------
def soak_rank(rank: int, size: int, n: int, seed: int, mark: int, check_every: int) -> dict[str, Any]:
    """Run operations 0..n-1 of sequence ``seed``; check every ``check_every``-th one.

    Returns probes taken after a 100-operation warm-up ("start"), after ``mark`` operations
    and at the end, the RSS every ``mark`` operations, the number of operations checked, the
    first wrong result (if any), the operation counts by kind, and what is left after ``destroy_process_group`` (pydist
    threads, sockets). A single-rank world is initialised again at the end so that the
    harness's own ``destroy_process_group`` has something to destroy."""
    probes: dict[str, Any] = {}
    checked, wrong, by_kind = 0, None, dict.fromkeys(KINDS, 0)
    series: list[tuple[int, int]] = []  # (operations done, RSS KiB) every ``mark`` operations
    started = time.monotonic()
    for i in range(n):
        spec = plan(seed, i, size)
        got = run_op(rank, size, spec, i)
        by_kind[spec.kind] += 1
        if i % check_every == 0:
            checked += 1
            problem = check_op(rank, size, spec, i, got)
            if problem is not None and wrong is None:
                wrong = problem
        if i + 1 == min(100, n):
            probes["start"] = probe()
        if i + 1 == mark:
            probes["mark"] = probe()
        if (i + 1) % mark == 0:
            series.append((i + 1, rss_kib()))
    probes["end"] = probe()
    elapsed = time.monotonic() - started
    sockets_before = {fd for fd, target in probes["end"]["fds"].items() if target.startswith("socket:")}
    dist.destroy_process_group()
    after = probe()
    gc.collect()
    after_gc = probe()
    sockets_after = {fd for fd, target in after["fds"].items() if target.startswith("socket:")}
    dist.init_process_group("pydist", store=dist.HashStore(), rank=0, world_size=1)
    return {"probes": probes, "series": series, "after_destroy": after, "after_gc": after_gc, "checked": checked,
            "wrong": wrong,
            "kinds": by_kind, "elapsed": elapsed, "sockets_before_destroy": len(sockets_before),
            "sockets_after_destroy": sorted(sockets_after & sockets_before)}


def shm_fds(snapshot: dict[str, Any]) -> list[str]:
    """The /dev/shm files a probe's descriptors point to."""
    return sorted(target for target in snapshot["fds"].values() if target.startswith("/dev/shm/"))


# -- SIGKILL trials -------------------------------------------------------------------------------
def kill_trial_rank(rank: int, size: int, port: int, seed: int, reports: Any, kinds: tuple[str, ...] = KINDS,
                    max_bytes: int = MAX_BYTES, env: dict[str, str] | None = None,
                    root: int | None = None, min_bytes: int = 1) -> None:
    """Loop over the random sequence until something raises; report when and what. ``env``
    is set first ({rank} in a value is replaced by the rank, {rank//2} by half of it); ``root``
    fixes broadcast's source."""
    os.environ.update({name: text.replace("{rank}", str(rank)).replace("{rank//2}", str(rank // 2))
                       for name, text in (env or {}).items()})
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
    dist.init_process_group("pydist", timeout=timedelta(seconds=GROUP_TIMEOUT_S))
    i = 0
    try:
        while True:
            spec = plan(seed, i, size, kinds, max_bytes, min_bytes)
            run_op(rank, size, spec if root is None else spec._replace(root=root), i)
            if i == 2:
                reports.put(("ready", rank, os.getpid(), time.monotonic()))
            i += 1
    except BaseException as error:  # noqa: BLE001 - what the survivors raise is the point
        raised_at = time.monotonic()
        reports.put(("raised", rank, raised_at, CALLED_AT[0], i, type(error).__name__,
                     [c.__name__ for c in type(error).__mro__], str(error)[:4000], getattr(error, "rank", None)))
    started = time.monotonic()
    try:
        dist.destroy_process_group()
        problem = None
    except BaseException as error:  # noqa: BLE001
        problem = f"{type(error).__name__}: {error}"
    reports.put(("destroyed", rank, time.monotonic() - started, problem))


class Survivor(NamedTuple):
    rank: int
    detect_s: float        # to the exception from the kill, or from the call that raised if later, seconds
    op_index: int          # the operation that raised
    error_type: str
    error_mro: list[str]
    message: str
    error_rank: int | None  # the exception's .rank attribute, if any


def kill_trial(trial: int, size: int = 4, max_delay_s: float = 0.4, hang_s: float = HANG_S,
               start_timeout_s: float = 60.0, kinds: tuple[str, ...] = KINDS, victim: int | None = None,
               max_bytes: int = MAX_BYTES, env: dict[str, str] | None = None,
               root: int | None = None, min_bytes: int = 1) -> dict[str, Any]:
    """One trial: ``size`` ranks (env:// rendezvous, the default tcp+shm transport, ``env``
    set in each) loop over random collectives of up to ``max_bytes``; after all of them are
    in the loop, wait a random 0..``max_delay_s`` and SIGKILL ``victim`` (default: a random
    rank). Survivors that have not raised ``hang_s`` after the kill are hangs (and are
    killed). Every process is joined or killed by pid before returning. ``kinds`` restricts
    the operations (default: all of KINDS); ``root`` fixes broadcast's source; sizes are
    log-uniform in ``min_bytes`` .. ``max_bytes``."""
    rng = random.Random(trial)
    drawn, delay = rng.randrange(size), rng.uniform(0.0, max_delay_s)
    victim = drawn if victim is None else victim
    reports = _CONTEXT.Queue()
    port = free_port()
    procs = [_CONTEXT.Process(target=kill_trial_rank,
                              args=(r, size, port, trial, reports, kinds, max_bytes, env, root, min_bytes),
                              name=f"pydist-kill-{r}")
             for r in range(size)]
    for proc in procs:
        proc.start()
    raised: dict[int, Survivor] = {}
    destroyed: dict[int, tuple[float, str | None]] = {}
    ready: dict[int, int] = {}
    early: list[str] = []
    killed_at = None
    try:
        deadline = time.monotonic() + start_timeout_s
        while len(ready) < size:
            item = reports.get(timeout=max(0.01, deadline - time.monotonic()))
            if item[0] == "ready":
                ready[item[1]] = item[2]
            else:
                early.append(repr(item))
        time.sleep(delay)
        os.kill(ready[victim], signal.SIGKILL)
        killed_at = time.monotonic()
        deadline = killed_at + hang_s
        survivors = set(range(size)) - {victim}
        while (survivors - raised.keys() or survivors - destroyed.keys()) and time.monotonic() < deadline:
            try:
                item = reports.get(timeout=max(0.01, min(0.2, deadline - time.monotonic())))
            except queue.Empty:
                continue
            if item[0] == "raised":
                rank = item[1]
                raised[rank] = Survivor(rank, item[2] - max(killed_at, item[3]), *item[4:])
            elif item[0] == "destroyed":
                destroyed[item[1]] = (item[2], item[3])
        hangs = sorted(survivors - raised.keys())
        slow_destroy = sorted(survivors - destroyed.keys())
    finally:
        stop_processes(procs, 2.0)
        reports.close()
        reports.join_thread()
    return {"trial": trial, "victim": victim, "delay_s": delay, "survivors": raised, "hangs": hangs,
            "destroy": destroyed, "destroy_unfinished": slow_destroy, "early": early}


def violations(result: dict[str, Any], detect_bound_s: float = DETECT_BOUND_S) -> list[str]:
    """What is wrong with one trial's result: hangs, late detection, an exception that is
    not a DistNetworkError or does not name the dead rank, destroy failing."""
    victim = result["victim"]
    problems = [f"rank {r} hung (no exception within the hang bound)" for r in result["hangs"]]
    for s in result["survivors"].values():
        if s.detect_s > detect_bound_s:
            problems.append(f"rank {s.rank} took {s.detect_s:.3f} s to raise ({s.error_type}: {s.message[:200]})")
        if "DistNetworkError" not in s.error_mro:
            problems.append(f"rank {s.rank} raised {s.error_type} (not a DistNetworkError): {s.message[:300]}")
        if not re.search(rf"\brank {victim}\b", s.message):
            problems.append(f"rank {s.rank}'s {s.error_type} does not name the dead rank {victim}: {s.message[:300]}")
    for rank, (_seconds, problem) in result["destroy"].items():
        if problem is not None:
            problems.append(f"rank {rank}: destroy_process_group after the failure raised {problem[:300]}")
    problems += [f"rank {r}: destroy_process_group did not return in time" for r in result["destroy_unfinished"]]
    problems += [f"unexpected report before the kill: {e[:300]}" for e in result["early"]]
    return problems


def summarize(results: list[dict[str, Any]], detect_bound_s: float = DETECT_BOUND_S) -> dict[str, Any]:
    """Figures over many trials: detection times (worst, median, p90, histogram), hangs,
    exception types, destroy times, and every violation (late: after ``detect_bound_s``)."""
    times = sorted(s.detect_s for r in results for s in r["survivors"].values())
    destroy = sorted(seconds for r in results for seconds, _ in r["destroy"].values())
    buckets = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, float("inf")]
    histogram = {f"<={b:g}s": sum(1 for t in times if t <= b and (i == 0 or t > buckets[i - 1]))
                 for i, b in enumerate(buckets)}
    types: dict[str, int] = {}
    for r in results:
        for s in r["survivors"].values():
            types[s.error_type] = types.get(s.error_type, 0) + 1
    problems = [f"trial {r['trial']} (victim {r['victim']}): {p}" for r in results
                for p in violations(r, detect_bound_s)]
    return {"trials": len(results), "detections": len(times), "hangs": sum(len(r["hangs"]) for r in results),
            "worst_s": times[-1] if times else None, "median_s": statistics.median(times) if times else None,
            "p90_s": times[int(0.9 * (len(times) - 1))] if times else None, "histogram": histogram,
            "error_types": types, "destroy_worst_s": destroy[-1] if destroy else None, "violations": problems}
