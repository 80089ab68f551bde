"""`make gpu-check`: the checks of issue 47 item 6 that need a GPU, in one call, one table.

Run (a GPU machine, from the source tree, no venv, no network):
    sh tools/gpu_check.sh            (PYTHONPATH=src python3 tools/gpu_check.py)
Without a CUDA GPU it says so in one line and exits 0. On a GPU it runs each check in turn,
under its own time limit (the whole run fits 7 minutes), prints one row per check and writes
the table to $OUT/gpu-check.md ($OUT set) or build/gpu-check.md. Exit status 0 when no check
failed. A check is a function of the device kind returning (status, detail).
``--device standin`` runs the engine's checks (3-10) on pydist's strict CPU stand-in of a
GPU, with small sizes: the script itself, proven anywhere (the CUDA-only checks say SKIP).

 1 versions, the device's UUID (also under CUDA_VISIBLE_DEVICES set by index and by UUID),
   the IPC handle sizes (CUDA's memory handle, torch's own, torch's event handle, pydist's).
 2 the device contract suite with the CUDA implementation (pytest -m device -k cuda: one
   process, then two processes on cuda:0).
 3 cross-process event ordering: the producer's stream held back with torch.cuda._sleep, then
   it writes; the consumer waits on the imported event (its host not blocked) and reads the
   new value; then two slots reused for ROUNDS rounds.
 4-7, 9, 10 the device engine (gpu_check_engine.py, gpu_check_streams.py); 8 the staged path
   across hosts (gpu_check_staged.py: every collective and send/recv at chunk edges with
   ranks posing as 2 hosts, pipelined against serial staging at 64 and 256 MiB, gloo beside);
   then what gpu-check ran before (tests marked gpu, tools/gpu_bench.py).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check_engine as engine  # noqa: E402 - after the path it needs
import gpu_check_staged as staged  # noqa: E402
import gpu_check_streams as streams  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
ROUNDS = 20
Row = tuple[str, str]  # (status, detail)


def no_gpu() -> str | None:
    """Why there is no CUDA GPU to check here, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device (torch.cuda.is_available() is False)"
    return None


def run(command: list[str], limit: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``command`` from the source tree, its output captured, killed past ``limit`` seconds."""
    return subprocess.run(command, cwd=ROOT, env=env or ENV, capture_output=True, text=True, timeout=limit)


# -- 1 ------------------------------------------------------------------------------------------

_UUID = "import torch; print(torch.cuda.get_device_properties(0).uuid)"


def versions_and_handles() -> Row:
    import torch

    from pydist.device.cuda import CudaDevice
    from pydist.device.cudart import IPC_HANDLE_SIZE
    from pydist.device.handles import decode

    device = CudaDevice(0, rank=0)
    runtime, driver = device.runtime.versions()
    buffer = device.allocate(1 << 20)
    ours = device.export(buffer)
    raw = decode(ours).payload
    storage = torch.empty(1 << 20, dtype=torch.uint8, device="cuda").untyped_storage()
    torch_handle = storage._share_cuda_()[1]
    event_handle = torch.cuda.Event(interprocess=True).ipc_handle()
    device.free(buffer)
    by_index = run([sys.executable, "-c", _UUID], 60, {**ENV, "CUDA_VISIBLE_DEVICES": "0"}).stdout.strip()
    visible = device.uuid if device.uuid.startswith(("GPU-", "MIG-")) else f"GPU-{device.uuid}"
    by_uuid = run([sys.executable, "-c", _UUID], 60, {**ENV, "CUDA_VISIBLE_DEVICES": visible}).stdout.strip()
    detail = (f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), runtime "
              f"{runtime}, driver {driver}, {torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} device(s); "
              f"uuid {device.uuid} (CUDA_VISIBLE_DEVICES=0: {by_index or '?'}, =uuid: {by_uuid or '?'}); "
              f"handles: cudaIpcMemHandle_t {len(raw)} (declared {IPC_HANDLE_SIZE}), torch's memory handle "
              f"{len(torch_handle)}, torch's event handle {len(event_handle)}, pydist's envelope {len(ours)}; "
              f"libcudart {device.runtime.path}")
    agree = by_index == by_uuid == device.uuid
    return ("PASS" if len(raw) == IPC_HANDLE_SIZE and agree else "FAIL"), detail


# -- 2 ------------------------------------------------------------------------------------------

def contract_suite() -> Row:
    files = ["tests/test_device_contract.py", "tests/test_device_contract_ipc.py"]
    done = run([sys.executable, "-m", "pytest", "-m", "device", "-k", "cuda", "-o", "addopts=", "-p",
                "no:cacheprovider", "-q", "-rfE", *files], 300)
    summary = (done.stdout.strip().splitlines() or ["no output"])[-1]
    failures = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return ("PASS" if done.returncode == 0 else "FAIL"), "; ".join([summary, *failures[:5]])


# -- 3 ------------------------------------------------------------------------------------------

def _producer(kind: str, link, ready, hold_s: float) -> None:
    from pydist.core.deadline import Deadline
    from pydist.device import open_device

    device = open_device(kind, 0, rank=0)
    buffer, written = device.allocate(2 * 4096), device.event(interprocess=True)
    slots = [device.view(buffer, "float32", 1024, offset=4096 * i) for i in range(2)]
    done = [device.event(interprocess=True) for _ in range(2)]
    link.send((device.export(buffer), written.export(), [e.export() for e in done]))
    reader_done = [device.open_event(h) for h in link.recv()]
    stream = device.new_stream()
    device.copy(slots[0], np.zeros(1024, np.float32), stream)
    stream.synchronize(Deadline.after(30))
    ready.wait()
    device.delay(hold_s, stream)  # the GPU is busy: the write comes hold_s later
    device.copy(slots[0], np.full(1024, 7, np.float32), stream)
    written.record(stream)
    link.send(time.monotonic())
    link.recv()
    for k in range(ROUNDS):  # two slots: slot k % 2 rewritten once the reader is done with round k - 2
        if k >= 2:
            assert link.recv() == k - 2
            stream.wait_event(reader_done[k % 2])
        device.copy(slots[k % 2], np.full(1024, k, np.float32), stream)
        done[k % 2].record(stream)
        link.send(k)
    assert [link.recv() for _ in range(2)] == [ROUNDS - 2, ROUNDS - 1]
    assert link.recv() == "closed"
    stream.synchronize(Deadline.after(30))
    del slots
    device.free(buffer)


def _consumer(kind: str, link, ready, hold_s: float, results) -> None:
    from pydist.core.deadline import Deadline
    from pydist.device import open_device

    device = open_device(kind, 0, rank=1)
    handle, written_handle, done_handles = link.recv()
    mapping, written = device.open(handle), device.open_event(written_handle)
    slots = [device.view(mapping, "float32", 1024, offset=4096 * i) for i in range(2)]
    written_by_peer = [device.open_event(h) for h in done_handles]
    reader_done = [device.event(interprocess=True) for _ in range(2)]
    link.send([e.export() for e in reader_done])
    stream, out = device.new_stream(), device.empty((1024,), "float32")
    ready.set()
    recorded_at = link.recv()
    started = time.monotonic()
    stream.wait_event(written)
    device.copy(out, slots[0], stream)
    enqueue_s = time.monotonic() - started
    value = device.to_host(out, stream, Deadline.after(30))
    seen_after = time.monotonic() - recorded_at
    link.send("read")
    rounds = device.empty((ROUNDS, 1024), "float32")
    for k in range(ROUNDS):
        assert link.recv() == k
        stream.wait_event(written_by_peer[k % 2])
        device.copy(rounds[k], slots[k % 2], stream)
        reader_done[k % 2].record(stream)
        link.send(k)
    got = device.to_host(rounds, stream, Deadline.after(30))
    del slots
    device.close(mapping)
    link.send("closed")
    results.put((float(value.min()), float(value.max()), enqueue_s, seen_after,
                 bool((got == np.arange(ROUNDS, dtype=np.float32)[:, None]).all())))


def event_ordering(hold_s: float = 0.5, kind: str = "cuda") -> Row:
    """Check 3 on a device of ``kind`` (cuda here; the tests run it on the stand-in)."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    ready, results = context.Event(), context.Queue()
    procs = [context.Process(target=_producer, args=(kind, ours, ready, hold_s)),
             context.Process(target=_consumer, args=(kind, theirs, ready, hold_s, results))]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    alive = [proc for proc in procs if proc.is_alive()]
    for proc in alive:
        proc.kill()
    if alive or any(proc.exitcode for proc in procs) or results.empty():
        return "FAIL", f"exit codes {[proc.exitcode for proc in procs]} (a rank failed or hung)"
    low, high, enqueue_s, seen_after, rounds_ok = results.get()
    detail = (f"consumer read {low:g}..{high:g} (7 expected) {seen_after:.3f} s after the record "
              f"(the GPU held {hold_s} s), its enqueue took {enqueue_s * 1e6:.0f} µs (host not blocked); "
              f"{ROUNDS} rounds over 2 slots {'correct' if rounds_ok else 'WRONG'}")
    ok = low == high == 7 and seen_after >= hold_s * 0.5 and enqueue_s < hold_s / 2 and rounds_ok
    return ("PASS" if ok else "FAIL"), detail


# -- 4-10 -----------------------------------------------------------------------------------------

def cuda_only(check: Callable[[], Row]) -> Callable[[str], Row]:
    """``check`` on CUDA; SKIP on the stand-in."""
    def run(kind: str) -> Row:
        return check() if kind == "cuda" else ("SKIP", "CUDA only")
    return run


def tests_marked_gpu() -> Row:
    done = run([sys.executable, "-m", "pytest", "-m", "gpu", "-o", "addopts=", "-p", "no:cacheprovider", "-q",
                "tests/test_torch_gpu.py"], 300)
    return ("PASS" if done.returncode == 0 else "FAIL"), (done.stdout.strip().splitlines() or ["no output"])[-1]


def gpu_bench() -> Row:
    done = run([sys.executable, "tools/gpu_bench.py", "--sizes", "4,1M,16M", "--iters", "5"], 240)
    lines = done.stdout.strip().splitlines()
    return ("PASS" if done.returncode == 0 else "FAIL"), " / ".join(lines[-4:]) if lines else "no output"


CHECKS: list[tuple[str, str, Callable[[str], Row]]] = [
    ("1", "versions, UUID, IPC handle sizes", cuda_only(versions_and_handles)),
    ("2", "contract suite on CUDA (2 processes on cuda:0)", cuda_only(contract_suite)),
    ("3", "event ordering across processes (_sleep), slot reuse", lambda kind: event_ordering(kind=kind)),
    ("4", "every collective, fp32/bf16/int64, 1 B-256 MiB, 2 and 4 ranks on one GPU", engine.every_collective),
    ("5", "a short run under TORCH_CUDA_SANITIZER=1", streams.sanitizer),
    ("6", "non-default caller stream, async_op both ways, wait() not blocking", streams.streams),
    ("7", "inputs freed right after the call, empty_cache on the peers", streams.freed_inputs),
    ("8", "staged path over loopback TCP: chunk edges, pipelined vs serial", staged.check),
    ("9", "a peer killed mid-call: the survivor names it by the deadline", streams.killed_peer),
    ("10", "pydist-bench --device cuda against gloo, with and without MPS", streams.bench),
    ("-", "tests marked gpu (pydist beside gloo)", cuda_only(tests_marked_gpu)),
    ("-", "tools/gpu_bench.py (pydist beside gloo against gloo)", cuda_only(gpu_bench)),
]


def table(rows: list[tuple[str, str, str, float, str]]) -> str:
    """The results as a markdown table."""
    lines = ["| # | check | result | seconds | detail |", "|---|---|---|---|---|"]
    lines += [f"| {n} | {name} | {status} | {seconds:.1f} | {detail.replace('|', '/')} |"
              for n, name, status, seconds, detail in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="issue 47's GPU checks, one table")
    parser.add_argument("--device", choices=["cuda", "standin"], default="cuda",
                        help="standin: the engine's checks on pydist's CPU stand-in of a GPU (proves the script)")
    parser.add_argument("--only", help="comma list of check numbers to run (default: all)")
    args = parser.parse_args(argv)
    reason = no_gpu() if args.device == "cuda" else None
    if reason is not None:
        print(f"gpu-check: no CUDA GPU here ({reason}): nothing to check")
        return 0
    chosen = set(args.only.split(",")) if args.only else None
    rows = []
    for number, name, check in CHECKS:
        if chosen is not None and number not in chosen:
            continue
        started = time.monotonic()
        try:
            status, detail = check(args.device)
        except Exception as error:  # noqa: BLE001 - a failed check is a row, the others still run
            status, detail = "FAIL", f"{type(error).__name__}: {error}"
        rows.append((number, name, status, time.monotonic() - started, detail))
        print(f"gpu-check {number:>2} {status:<7} {name}: {detail}", flush=True)
    out = os.environ.get("OUT") or os.path.join(ROOT, "build")
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "gpu-check.md")
    with open(path, "w") as report:
        report.write(table(rows))
    print(f"gpu-check: table in {path}")
    return 1 if any(row[2] == "FAIL" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
