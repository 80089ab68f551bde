"""Quick versions of the soak and of the SIGKILL trials over 4 processes (the long ones:
tests/test_robustness_soak.py; the rank programs: tests/run_scripts/robust_ranks.py), and
destroy_process_group releasing shared memory without the garbage collector.
"""
from __future__ import annotations

import os
import re
import time

import pytest
from run_scripts import robust_ranks

from pydist.testing import run_processes, stop_processes

pytestmark = pytest.mark.slow  # 4 real processes for seconds each


# =============================================================================================
# 3. Quick soak and SIGKILL trials on 4 processes (the long ones: tests/test_robustness_soak.py)
# =============================================================================================
def check_soak(results: list[dict], mark: int, rss_bound_kib: int) -> list[str]:
    """Every rank's soak result against the bounds: right results, RSS from the mark to the
    end within ``rss_bound_kib``, no new threads or descriptors, nothing left after destroy."""
    problems = []
    for rank, r in enumerate(results):
        p = r["probes"]
        if r["wrong"] is not None:
            problems.append(r["wrong"])
        growth = p["end"]["rss_kib"] - p["mark"]["rss_kib"]
        if growth > rss_bound_kib:
            problems.append(f"rank {rank}: RSS grew by {growth} KiB from op {mark} to the end (bound {rss_bound_kib})")
        for what in ("os_threads", "pydist_threads"):
            if p["end"][what] != p["start"][what]:
                problems.append(f"rank {rank}: {what} {p['start'][what]} after warm-up, {p['end'][what]} at the end")
        if sorted(p["end"]["fds"].values()) != sorted(p["start"]["fds"].values()):
            problems.append(f"rank {rank}: descriptors changed: {sorted(p['start']['fds'].values())} -> "
                            f"{sorted(p['end']['fds'].values())}")
        if r["after_destroy"]["pydist_threads"]:
            problems.append(f"rank {rank}: threads after destroy_process_group: "
                            f"{r['after_destroy']['pydist_threads']}")
        if r["sockets_after_destroy"]:
            problems.append(f"rank {rank}: sockets still open after destroy_process_group: "
                            f"{r['sockets_after_destroy']}")
        if robust_ranks.shm_fds(r["after_destroy"]):
            problems.append(f"rank {rank}: shared memory still open after destroy_process_group: "
                            f"{robust_ranks.shm_fds(r['after_destroy'])}")
    return problems


def soak_report(results: list[dict], n: int, seconds: float) -> str:
    lines = [f"SOAK {n} ops on {len(results)} processes in {seconds:.1f} s "
             f"({n / max(r['elapsed'] for r in results):.0f} ops/s per rank); "
             f"checked {results[0]['checked']} per rank; "
             f"ops by kind {results[0]['kinds']}"]
    for rank, r in enumerate(results):
        p = r["probes"]
        lines.append(f"  rank {rank}: RSS KiB start {p['start']['rss_kib']} mark {p['mark']['rss_kib']} "
                     f"end {p['end']['rss_kib']} (end-mark {p['end']['rss_kib'] - p['mark']['rss_kib']:+d}) "
                     f"after destroy {r['after_destroy']['rss_kib']} after gc {r['after_gc']['rss_kib']}; "
                     f"threads {p['start']['os_threads']}->{p['end']['os_threads']}"
                     f"->{r['after_destroy']['os_threads']}; "
                     f"fds {len(p['start']['fds'])}->{len(p['end']['fds'])}->{len(r['after_destroy']['fds'])}"
                     f"->{len(r['after_gc']['fds'])}; "
                     f"shm fds after destroy {len(robust_ranks.shm_fds(r['after_destroy']))}")
        lines.append(f"    RSS KiB every {r['series'][0][0] if r['series'] else '-'} ops: "
                     f"{[kib for _, kib in r['series']]}")
    return "\n".join(lines)


def _shm_segments() -> set[str]:
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith("pydist")}
    except FileNotFoundError:
        return set()


def run_soak(n: int, mark: int, rss_bound_kib: int, seed: int = 1234, check_every: int = 10) -> None:
    segments = _shm_segments()
    started = time.monotonic()
    results = run_processes(4, robust_ranks.soak_rank, n, seed, mark, check_every, timeout=max(120, n / 50))
    print("\n" + soak_report(results, n, time.monotonic() - started))
    assert check_soak(results, mark, rss_bound_kib) == []
    assert _shm_segments() - segments == set()


def test_quick_soak_of_random_collectives_on_four_processes():
    run_soak(2000, mark=500, rss_bound_kib=8 * 1024)


def kill_report(summary: dict) -> str:
    return (f"SIGKILL {summary['trials']} trials: {summary['hangs']} hangs, {summary['detections']} survivor "
            f"detections, worst {summary['worst_s']:.3f} s, median {summary['median_s']:.3f} s, "
            f"p90 {summary['p90_s']:.3f} s, histogram {summary['histogram']}, errors {summary['error_types']}, "
            f"destroy worst {summary['destroy_worst_s']:.3f} s, {len(summary['violations'])} violations")


def run_kill_trials(trials: range, detect_bound_s: float = robust_ranks.DETECT_BOUND_S, **kwargs) -> dict:
    results = [robust_ranks.kill_trial(t, **kwargs) for t in trials]
    summary = robust_ranks.summarize(results, detect_bound_s)
    print("\n" + kill_report(summary))
    for problem in summary["violations"]:
        print("  " + problem[:400])
    return summary


def test_quick_sigkill_trials_never_hang_and_detect_before_the_timeout():
    """5 trials: no hang, every survivor raises a DistNetworkError naming the dead rank well
    before the group timeout (robust_ranks.DETECT_BOUND_S: detected, not timed out), and
    destroy_process_group then returns (100 trials, with the 2 s and 5 s bounds: test_robustness_soak)."""
    summary = run_kill_trials(range(5))
    assert summary["hangs"] == 0
    assert summary["detections"] == 5 * 3
    assert summary["violations"] == []  # late detections and destroys that did not return included


def test_every_survivor_raises_a_network_error_naming_the_dead_rank():
    summary = run_kill_trials(range(5), kinds=("all_reduce",))
    assert summary["violations"] == []
    assert all(t == "PeerFailedError" for t in summary["error_types"])


def _p2p_then_leave(rank: int, size: int, port: int, reports) -> None:
    """Rank 3 dies; rank 2, in a recv from it, raises and shuts down; ranks 0 and 1 are in
    an all_reduce of the world group, which rank 3's death breaks."""
    import signal as signals

    import numpy as np

    import pydist as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
    dist.init_process_group("pydist")
    t = np.zeros(4, np.float32)
    dist.all_reduce(t)
    try:
        if rank == 3:
            time.sleep(0.3)
            os.kill(os.getpid(), signals.SIGKILL)
        elif rank == 2:
            dist.recv(t, src=3)
        else:
            dist.all_reduce(t)
    except Exception as error:  # noqa: BLE001
        reports.put((rank, type(error).__name__, str(error)))
    dist.destroy_process_group()


def test_ranks_blocked_in_a_collective_name_the_dead_rank_not_the_one_that_shut_down_after_it():
    from pydist.testing.processes import start_ranks
    procs, reports = start_ranks(_p2p_then_leave, 4)
    try:
        got = {}
        deadline = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < deadline:
            rank, kind, message = reports.get(timeout=max(0.01, deadline - time.monotonic()))
            got[rank] = (kind, message)
    finally:
        stop_processes(procs, 10)
        reports.close()
        reports.join_thread()
    print(got)
    assert sorted(got) == [0, 1, 2]
    for rank, (kind, message) in got.items():
        assert re.search(r"\brank 3\b", message), f"rank {rank} raised {kind}: {message}"


def _shm_fds_after_destroy(rank: int, size: int) -> list[str]:
    import numpy as np

    import pydist as dist
    t = np.ones(1024, np.float32)
    dist.all_reduce(t)
    dist.destroy_process_group()
    left = robust_ranks.shm_fds(robust_ranks.probe())  # no gc.collect() first: destroy must release them
    dist.init_process_group("pydist", store=dist.HashStore(), rank=0, world_size=1)  # for the harness's destroy
    return left


def test_destroy_process_group_releases_shared_memory_without_the_garbage_collector():
    assert run_processes(2, _shm_fds_after_destroy, timeout=60) == [[], []]
