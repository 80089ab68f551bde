"""Ranks that lose members and shrink, and a harness (tests/test_group_shrink.py, tools/shrink_trials.py).

Imported, not run: forkserver children unpickle ``shrink_rank`` by module name.

:func:`shrink_trial` starts ``size`` ranks (env://) that all_reduce in a loop (checking every
result), SIGKILLs the ``victims`` by pid after ``delay`` seconds, and reports for every
survivor what it raised, the group it shrank to (its new rank and size, the members), the
all_reduce it then completed on it (checked) and when, in wall-clock time, so the harness
gives each survivor's recovery time from the kill.
"""
from __future__ import annotations

import os
import queue
import signal
import time
import traceback
from datetime import timedelta
from typing import Any

import numpy as np

from pydist.testing import free_port, stop_processes
from pydist.testing.processes import _CONTEXT


def _die_after_proposing() -> None:
    """This rank dies inside shrink_group, right after its proposal went to the leader."""
    from pydist.groups import agreement as _agreement
    wait = _agreement._wait

    def wait_then_die(request, deadline, transport, waiting_for):
        wait(request, deadline, transport, waiting_for)
        if "the proposal to rank" in waiting_for:
            os.kill(os.getpid(), signal.SIGKILL)
    _agreement._wait = wait_then_die


def shrink_rank(rank: int, size: int, port: int, results, env: dict, subgroup: bool, flags: int,
                async_in_flight: bool) -> None:
    """One rank: all_reduce until an operation fails, then shrink (the default group, or a
    subgroup of every rank when ``subgroup``), all_reduce once on the result and report.
    PYDIST_TEST_DIES_IN_SHRINK=R (in ``env``): rank R dies inside the shrink."""
    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
    if env.get("PYDIST_TEST_DIES_IN_SHRINK") == str(rank):
        _die_after_proposing()
    import pydist as dist
    report: dict[str, Any] = {"rank": rank}
    try:
        dist.init_process_group("pydist", timeout=timedelta(seconds=30))
        group = dist.new_group(list(range(size))) if subgroup else None
        results.put(("ready", rank, os.getpid()))
        buf, steps = np.ones(4, np.float32), 0
        try:
            while True:
                buf[:] = 1
                if async_in_flight:  # queued work of the group when it breaks: SHRINK_ABORT fails it
                    works = [dist.all_reduce(buf, group=group, async_op=True) for _ in range(3)]
                    for work in works:
                        work.wait()
                    buf[:] = 1
                dist.all_reduce(buf, group=group)
                if buf[0] != size:
                    raise AssertionError(f"all_reduce gave {buf[0]}, expected {size}")
                steps += 1
        except dist.DistError as error:
            report.update(error=type(error).__name__, dead_ranks=sorted(error.dead_ranks), steps=steps,
                          raised_at=time.time())
            dead = sorted(error.dead_ranks) or [error.rank]
        shrunk = dist.shrink_group(dead, group=group, shrink_flags=flags)
        buf[:] = 1
        dist.all_reduce(buf, group=shrunk)
        report.update(done_at=time.time(), value=float(buf[0]), new_rank=shrunk.rank(), new_size=shrunk.size(),
                      members=dist.get_process_group_ranks(shrunk), world_rank=dist.get_rank(),
                      world_size=dist.get_world_size())
        dist.destroy_process_group()
        report["threads_left"] = _pydist_threads()
    except BaseException:  # noqa: BLE001 - reported to the harness
        report["failure"] = traceback.format_exc()
    results.put(("report", rank, report))


def _pydist_threads(wait: float = 5.0) -> list[str]:
    """pydist's threads still running after destroy_process_group (they get ``wait`` s to end)."""
    import threading
    end = time.monotonic() + wait
    while True:
        left = [t.name for t in threading.enumerate() if t.name.startswith("pydist") and t.is_alive()]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.05)


def torch_shrink_rank(rank: int, size: int, port: int, results, env: dict, subgroup: bool, flags: int,
                      async_in_flight: bool) -> None:
    """One rank of torch.distributed on the pydist plugin, with torch DDP: all_reduce until
    an operation fails, pydist.torch.shrink_group, then on the shrunk default group an
    all_reduce, a DDP rebuilt and a backward step, and a torch new_group's all_reduce."""
    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
    import torch
    import torch.distributed as tdist

    import pydist.torch
    report: dict[str, Any] = {"rank": rank}
    try:
        tdist.init_process_group("pydist", timeout=timedelta(seconds=30))
        model = torch.nn.Linear(4, 2)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        results.put(("ready", rank, os.getpid()))
        buf = torch.ones(4)
        try:
            while True:
                tdist.all_reduce(buf)
                buf.fill_(1)
        except pydist.DistError as error:
            report.update(error=type(error).__name__, dead_ranks=sorted(error.dead_ranks), raised_at=time.time())
            dead = sorted(error.dead_ranks) or [error.rank]
        shrunk = pydist.torch.shrink_group(dead, shrink_flags=flags)
        buf.fill_(1)
        tdist.all_reduce(buf)
        report.update(done_at=time.time(), value=float(buf[0]), new_rank=shrunk.rank(), new_size=shrunk.size(),
                      members=list(range(tdist.get_world_size())), world_rank=tdist.get_rank(),
                      world_size=tdist.get_world_size())
        del ddp
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp(torch.ones(3, 4)).sum().backward()
        report["grad"] = model.weight.grad.tolist()
        sub = tdist.new_group(list(range(tdist.get_world_size())))
        one = torch.ones(1)
        tdist.all_reduce(one, group=sub)
        report["new_group_sum"] = one.item()
        del ddp
        tdist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the harness
        report["failure"] = traceback.format_exc()
    results.put(("report", rank, report))


def shrink_trial(size: int, victims: list[int], delay: float, env: dict | None = None, subgroup: bool = False,
                 flags: int = 0, async_in_flight: bool = False, timeout: float = 60.0, target=shrink_rank) -> dict:
    """Run one trial (see the module note): {"killed_at", "reports": {rank: report}, "exit_codes"};
    ``target``: shrink_rank (pydist) or torch_shrink_rank (torch on the plugin)."""
    results = _CONTEXT.Queue()
    port = free_port()
    procs = [_CONTEXT.Process(target=target, args=(r, size, port, results, env or {}, subgroup, flags,
                                                     async_in_flight)) for r in range(size)]
    for proc in procs:
        proc.start()
    reports: dict[int, dict] = {}
    killed_at = None
    try:
        ready = 0
        end = time.monotonic() + timeout
        while ready < size:
            kind, rank, payload = results.get(timeout=max(0.1, end - time.monotonic()))
            if kind == "ready":
                ready += 1
            else:
                reports[rank] = payload
        time.sleep(delay)
        killed_at = time.time()
        for victim in victims:
            os.kill(procs[victim].pid, signal.SIGKILL)
        while len(reports) < size - len(victims) - ("PYDIST_TEST_DIES_IN_SHRINK" in (env or {})):
            kind, rank, payload = results.get(timeout=max(0.1, end - time.monotonic()))
            if kind == "report":
                reports[rank] = payload
    except queue.Empty:
        pass
    finally:
        stop_processes(procs, 10.0)
    also = [int((env or {}).get("PYDIST_TEST_DIES_IN_SHRINK", -1))]
    return {"killed_at": killed_at, "reports": reports, "exit_codes": [p.exitcode for p in procs],
            "victims": victims, "also_dies": [r for r in also if r >= 0], "size": size}


def problems(trial: dict) -> list[str]:
    """What a trial got wrong: a survivor missing, failing, with a wrong result or group."""
    size, victims = trial["size"], trial["victims"] + trial["also_dies"]
    survivors = [r for r in range(size) if r not in victims]
    found = []
    for rank in survivors:
        report = trial["reports"].get(rank)
        if report is None:
            found.append(f"rank {rank}: no report (hung or died)")
        elif "failure" in report:
            found.append(f"rank {rank}: {report['failure']}")
        elif report["value"] != len(survivors) or report["new_size"] != len(survivors):
            found.append(f"rank {rank}: shrank to {report['new_size']} ranks, all_reduce {report['value']}")
        elif report.get("threads_left"):
            found.append(f"rank {rank}: threads left after destroy_process_group: {report['threads_left']}")
    segments = [name for name in os.listdir("/dev/shm") if name.startswith("pydist")]
    if segments:
        found.append(f"shared-memory segments left: {segments}")
    return found


def recovery_seconds(trial: dict) -> list[float]:
    """Each survivor's time from the kill to its all_reduce done on the shrunk group."""
    return [r["done_at"] - trial["killed_at"] for r in trial["reports"].values() if "done_at" in r]
