"""gpu-check's checks 5, 6, 7, 9 and 10 of pydist's device engine (see gpu_check_engine.py).

Each returns (status, detail); ``kind`` is "cuda" on a GPU machine or "standin" anywhere.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from gpu_check_engine import ROOT, SRC, On, Row, run_ranks, values

HOLD_S = 0.5  # how long check 6 keeps the caller's stream busy before its call


@contextlib.contextmanager
def _calling_from(on: On, stream: Any) -> Iterator[None]:
    """``stream`` as the current stream meanwhile (torch.cuda.stream; the stand-in's using)."""
    with (on.torch.cuda.stream(stream) if on.kind == "cuda" else on.device.using(stream)):
        yield


def _hold(on: On, seconds: float) -> None:
    """Keep the current stream busy ``seconds`` (the work after it waits)."""
    if on.kind == "cuda":
        rate = getattr(on.torch.cuda.get_device_properties(0), "clock_rate", 0) * 1e3 or 1.5e9
        on.torch.cuda._sleep(int(seconds * rate))
    else:
        on.device.delay(seconds, on.device.current_stream())


def _busy(on: On) -> bool:
    """Whether the current stream still has work to do (asks without running any)."""
    if on.kind == "cuda":
        return not on.torch.cuda.current_stream().query()
    marker = on.device.event()
    marker.record(on.device.current_stream())
    return not marker.ran()


# -- 6: streams ---------------------------------------------------------------------------------

def _streams(rank: int, size: int, kind: str) -> dict:
    import pydist
    on = On(kind, rank)
    expected = values(1 << 16, 0, "float32") * size + size * (size - 1) // 2
    side = on.stream()
    with _calling_from(on, side):  # a blocking call from a non-default stream: its work on that stream
        x = on.up(values(1 << 16, rank, "float32"), "float32")
        pydist.all_reduce(x)
        blocking_ok = bool(np.array_equal(on.down(x), expected))
    y = on.up(values(1 << 16, rank, "float32"), "float32")
    work = pydist.all_reduce(y, async_op=True)
    work.wait()
    async_ok = bool(np.array_equal(on.down(y), expected))
    z = on.up(values(1 << 16, rank, "float32"), "float32")
    _hold(on, HOLD_S)  # the device is busy: the call's work comes after
    started = time.monotonic()
    work = pydist.all_reduce(z, async_op=True)
    work.wait()
    wait_s = time.monotonic() - started
    still_busy = _busy(on)
    held_ok = bool(np.array_equal(on.down(z), expected))
    return {"blocking": blocking_ok, "async": async_ok, "held": held_ok, "wait_s": wait_s, "busy": still_busy}


def streams(kind: str = "cuda") -> Row:
    results = run_ranks(2, _streams, kind, limit=180)
    right = all(r["blocking"] and r["async"] and r["held"] for r in results)
    waits = max(r["wait_s"] for r in results)
    busy = all(r["busy"] for r in results)
    detail = (f"blocking call from a side stream, async wait, async behind a {HOLD_S} s hold: results "
              f"{'right' if right else 'WRONG'}; wait() returned in {waits * 1e3:.1f} ms with the device "
              f"{'still busy' if busy else 'idle (the hold was over: inconclusive)'}")
    return ("PASS" if right and busy and waits < HOLD_S / 2 else "FAIL"), detail


# -- 5: the sanitizer ----------------------------------------------------------------------------

def sanitizer(kind: str = "cuda") -> Row:
    if kind != "cuda":
        return "SKIP", "TORCH_CUDA_SANITIZER checks CUDA streams only"
    results = run_ranks(2, _streams, kind, limit=240, env={"TORCH_CUDA_SANITIZER": "1"})
    right = all(r["blocking"] and r["async"] and r["held"] for r in results)
    return ("PASS" if right else "FAIL"), f"check 6's calls under TORCH_CUDA_SANITIZER=1: no race reported, " \
                                          f"results {'right' if right else 'WRONG'}"


# -- 7: inputs freed at once ---------------------------------------------------------------------

def _freed(rank: int, size: int, kind: str, rounds: int) -> int:
    import pydist
    on, wrong = On(kind, rank), 0
    n = 1 << 18
    for round_ in range(rounds):
        out = on.empty(n * size, "float32")
        source = on.up(values(n, rank, "float32", salt=round_), "float32")
        work = pydist.all_gather_into_tensor(out, source, async_op=round_ % 2 == 0)
        del source  # dropped at once: its memory may go to the next tensor
        if kind == "cuda":
            on.torch.cuda.empty_cache()
        junk = [on.up(np.full(n, -1, np.float32), "float32") for _ in range(2)]  # reuse it now
        if work is not None:
            work.wait()
        expected = np.concatenate([values(n, r, "float32", salt=round_) for r in range(size)])
        wrong += not np.array_equal(on.down(out), expected)
        del junk
    return wrong


def freed_inputs(kind: str = "cuda") -> Row:
    rounds = 20
    wrong = sum(run_ranks(2, _freed, kind, rounds, limit=180))
    detail = f"{rounds} all_gathers (async and blocking) of 1 MiB, inputs freed right after, " + \
             ("empty_cache, " if kind == "cuda" else "") + f"memory reused at once: {wrong} wrong"
    return ("PASS" if wrong == 0 else "FAIL"), detail


# -- 9: a peer killed mid-call --------------------------------------------------------------------

def _killed(rank: int, size: int, kind: str, mark: str) -> tuple[float, str]:
    import pydist
    on = On(kind, rank)
    x = on.up(values(1 << 18, rank, "float32"), "float32")
    try:
        for round_ in range(100000):
            pydist.all_reduce(x)
            if rank == 1 and round_ == 20:
                with open(mark, "w") as noted:
                    noted.write(repr(time.monotonic()))
                os.kill(os.getpid(), signal.SIGKILL)
            on.down(x[:1])
    except Exception as error:  # noqa: BLE001 - what the survivor saw
        return time.monotonic(), f"{type(error).__name__}: {error}"
    return time.monotonic(), "no error"


def killed_peer(kind: str = "cuda") -> Row:
    with tempfile.TemporaryDirectory(prefix="pydist-gpu-check-") as scratch:
        mark = os.path.join(scratch, "killed")
        survivors = run_ranks(3, _killed, kind, mark, limit=120, wait_for=[0, 2], env={"CHECK_TIMEOUT": "60"})
        with open(mark) as noted:
            killed_at = float(noted.read())
    named = all("rank 1" in message for _, message in survivors)
    seconds = max(at - killed_at for at, _ in survivors)
    detail = f"rank 1 of 3 SIGKILLed mid-loop; survivors raised {seconds:.3f} s later (group timeout 60 s): " + \
             " / ".join(message[:120] for _, message in survivors)
    return ("PASS" if named and seconds < 60 else "FAIL"), detail


# -- 10: pydist-bench -------------------------------------------------------------------------------

def _bench(kind: str, env: dict) -> dict:
    sizes = "4,4K,1M,16M,256M" if kind == "cuda" else "4,4K,64K"
    command = [sys.executable, "-m", "pydist.bench", "--device", kind, "--nproc", "2", "--sizes", sizes,
               "--iters", "5", "--warmup", "2", "--json", "--compare", "gloo,nccl" if kind == "cuda" else "gloo"]
    done = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": SRC, **env}, capture_output=True,
                          text=True, timeout=240)
    if done.returncode != 0:
        raise RuntimeError(f"pydist-bench failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def _summary(report: dict) -> str:
    cells = []
    for row in report["rows"]:
        results = row["results"]
        mine = results["pydist"]["time_us"]
        others = [f"{key} {value['time_us']:.0f}" for key, value in results.items() if key != "pydist" and value]
        cells.append(f"{row['bytes']} B: pydist {mine:.0f} us" + (f", {', '.join(others)} us" if others else ""))
    notes = [f"{b['key']}: {b['note']}" for b in report["backends"] if b["status"] != "ok"]
    return "; ".join(cells + notes)


def _copy_seconds(nbytes: int) -> float:
    """One device-to-device copy of ``nbytes`` on this GPU (median of 10)."""
    import torch
    src, dst = torch.ones(nbytes, dtype=torch.uint8, device="cuda"), torch.empty(nbytes, dtype=torch.uint8,
                                                                              device="cuda")
    times = []
    for _ in range(10):
        torch.cuda.synchronize()
        started = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return float(np.median(times))


@contextlib.contextmanager
def _mps() -> Iterator[dict | None]:
    """An MPS daemon of our own for the block's duration (None where there is none), stopped after."""
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="pydist-mps-") as scratch:
        env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(scratch, "pipe"), "CUDA_MPS_LOG_DIRECTORY":
               os.path.join(scratch, "log")}
        for path in env.values():
            os.makedirs(path)
        subprocess.run([control, "-d"], env={**os.environ, **env}, check=True, timeout=30)
        try:
            yield env
        finally:
            subprocess.run([control], input="quit\n", text=True, env={**os.environ, **env}, timeout=30)


def bench(kind: str = "cuda") -> Row:
    plain = _bench(kind, {})
    detail = f"without MPS: {_summary(plain)}"
    ok = True
    if kind == "cuda":
        rows = {row["bytes"]: row["results"] for row in plain["rows"]}
        big = [size for size in rows if size >= 16 << 20 and rows[size].get("gloo")]
        ratios = [rows[size]["gloo"]["time_us"] / rows[size]["pydist"]["time_us"] for size in big]
        copy = _copy_seconds(256 << 20)
        ours = rows[256 << 20]["pydist"]["time_us"] / 1e6
        ok = bool(ratios) and min(ratios) >= 20 and ours <= 1.5 * copy
        detail += (f"; gloo/pydist at >= 16 MiB: {', '.join(f'{r:.1f}x' for r in ratios)} (>= 20x asked); 256 MiB "
                   f"{ours * 1e6:.0f} us vs one copy {copy * 1e6:.0f} us ({ours / copy:.2f}x, <= 1.5x asked)")
        with _mps() as env:
            detail += "; MPS: none here" if env is None else f"; with MPS: {_summary(_bench(kind, env))}"
    return ("PASS" if ok else "FAIL"), detail
