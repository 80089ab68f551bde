"""gpu-check 8 (issue 47 item 6.8): the staged path of device tensors over loopback TCP.

Two processes, each posing as its own host (PYDIST_HOST_ID), both on device 0, run pydist's
staged all_reduce (pydist.algorithms.device_staged_reductions) with the host steps over TCP:

- chunk edges: all_reduce of float32, bfloat16 and int64 at 0, 1 and around 1 and 3 chunks
  of 4 KiB (a short last chunk, exactly one, one more element), all_gather and broadcast at
  one edge, each checked element by element;
- throughput at each size (default 64 and 256 MiB of float32, 4 MiB chunks): pipelined (3
  chunks in flight) against serial (one stage at a time, the same pool), the slowest rank's
  median of ``iters`` calls after a warm-up; on CUDA also torch's gloo all_reduce of the same
  CUDA tensor (the whole tensor through pinned memory, gloo's way) when torch has gloo.

Run: ``python tools/gpu_check_staged.py --device cuda`` (tools/gpu_check.py runs it as check 8),
or on any machine ``--device standin`` (the strict stand-in through the whole path; a thread
per rank runs the staging streams' work as it is enqueued, as copy engines would; the
stand-in copies every operation's inputs when it is enqueued, so its times are the stand-in's
more than the pipeline's) or ``--device model`` (the edges on the stand-in; the throughput
runs through the schedule alone, numpy arrays as device memory and a thread as the copy
engine: what pipelining buys when copies are asynchronous, at CPU speeds). Off a GPU the
figures are relative only. Prints one line; exit status 0 unless a result was wrong or a
rank failed.
"""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
Row = tuple[str, str]  # (status, detail)
SIZE = 2
EDGE_CHUNK = 4096
EDGES = {"float32": [0, 1, 1023, 1024, 1025, 3 * 1024 + 5], "bfloat16": [2047, 2048, 2049], "int64": [511, 513]}


def _pump(streams, stop: threading.Event) -> None:
    """The stand-in's copy engines: run the staging streams' work as soon as it can run."""
    while not stop.wait(0.0002):
        for stream in streams:
            stream.query()


def _staging(device, chunk: int, depth: int):
    from pydist.algorithms.device_staging import Staging, pinned_pool
    from pydist.core.deadline import Deadline

    pool = pinned_pool(device, chunk, 3 * chunk)
    return Staging(device, device.current_stream(), device.new_stream(), device.new_stream(), pool,
                   Deadline.after(300), depth=depth)


def _edges(device, host) -> list[str]:
    """The chunk-edge cases that came out wrong (empty: all right)."""
    from pydist.algorithms import device_staged_movement as moved
    from pydist.algorithms import device_staged_reductions as staged
    from pydist.core.buffers import bf16_bits_to_float32, float32_to_bf16_bits
    from pydist.core.deadline import Deadline
    from pydist.core.ops import RedOpType, ReduceOp

    staging, wrong, rank = _staging(device, EDGE_CHUNK, 3), [], host.rank

    def read(array) -> np.ndarray:
        return device.to_host(array, staging.caller, Deadline.after(60))

    for name, counts in EDGES.items():
        for count in counts:
            values = (np.arange(count) % 13 + rank).astype(np.float32 if name == "bfloat16" else name)
            held = float32_to_bf16_bits(values) if name == "bfloat16" else values
            tensor = device.from_host(held, name, staging.caller)
            staged.all_reduce(staging, host, tensor, ReduceOp(RedOpType.SUM))
            got = read(tensor)
            got = bf16_bits_to_float32(got) if name == "bfloat16" else got
            if not np.array_equal(got, 2 * (np.arange(count) % 13) + 1):
                wrong.append(f"all_reduce {name} x {count}")
    count = 1025
    outputs = [device.empty((count,), "float32") for _ in range(SIZE)]
    moved.all_gather(staging, host, outputs, device.from_host(np.full(count, rank, np.float32), "float32",
                                                             staging.caller))
    if any(not (read(out) == j).all() for j, out in enumerate(outputs)):
        wrong.append(f"all_gather float32 x {count}")
    tensor = device.from_host(np.arange(count, dtype=np.float32) + rank, "float32", staging.caller)
    moved.broadcast(staging, host, tensor, 1)
    if not np.array_equal(read(tensor), np.arange(count, dtype=np.float32) + 1):
        wrong.append(f"broadcast float32 x {count}")
    staging.pool.close()
    return wrong


@contextlib.contextmanager
def _stager(kind: str, device, host, nbytes: int, chunk: int, depth: int,
            copy_gbs: float) -> Iterator[Callable[[], None]]:
    """A staged all_reduce of ``nbytes`` of float32 at ``depth``, ready to run: through the
    device (the stand-in with a thread as its copy engine), or through the schedule alone
    with numpy arrays as device memory and a copy thread as the copy engine ("model")."""
    from pydist.algorithms import device_staged_reductions as staged
    from pydist.core.ops import RedOpType, ReduceOp

    op = ReduceOp(RedOpType.SUM)
    if kind == "model":
        engine = _CopyEngine(copy_gbs)
        try:
            yield lambda: engine.all_reduce(np.ones(nbytes // 4, np.float32), host, op, chunk, depth)
        finally:
            engine.close()
        return
    staging = _staging(device, chunk, depth)
    tensor = device.from_host(np.ones(nbytes // 4, np.float32), "float32", staging.caller)
    stop = threading.Event()
    pump = threading.Thread(target=_pump, args=((staging.down, staging.up), stop), daemon=True)
    if kind == "standin":
        pump.start()
    try:
        yield lambda: staged.all_reduce(staging, host, tensor, op)
    finally:
        stop.set()
        if pump.is_alive():
            pump.join()
        staging.pool.close()


class _CopyEngine:
    """A GPU's copy engine played by a thread: copies run in order, after the host starts them
    (numpy releases the GIL while it copies), so that they overlap the network step; with
    ``copy_gbs``, each takes at least its bytes at that rate (sleeping: a DMA engine does not
    use the CPU)."""

    def __init__(self, copy_gbs: float = 0.0) -> None:
        self.seconds_per_byte = 1 / (copy_gbs * 1e9) if copy_gbs else 0.0
        self.work: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while (item := self.work.get()) is not None:
            dst, src, done = item
            started = time.perf_counter()
            np.copyto(dst, src)
            time.sleep(max(0.0, dst.nbytes * self.seconds_per_byte - (time.perf_counter() - started)))  # PCIe
            done.set()

    def start(self, dst: np.ndarray, src: np.ndarray) -> _Started:
        done = threading.Event()
        self.work.put((dst, src, done))
        return _Started(done)

    def all_reduce(self, tensor: np.ndarray, host, op, chunk: int, depth: int) -> None:
        from pydist.core.deadline import Deadline
        from pydist.device.pinned_pool import PinnedPool
        from pydist.device.staged_schedule import cut, run_staged

        raw = tensor.view(np.uint8)
        pool: PinnedPool[np.ndarray] = PinnedPool(chunk, 3, lambda n: np.empty(n, np.uint8))

        def part(c, buffer):
            return buffer[:c.nbytes], raw[c.offset:c.offset + c.nbytes]
        run_staged(cut(raw.nbytes, chunk, 4), pool, lambda c, b: self.start(*part(c, b)),
                   lambda c, b: host.all_reduce(b[:c.nbytes].view(np.float32), op),
                   lambda c, b: self.start(*reversed(part(c, b))), Deadline.after(300), depth)

    def close(self) -> None:
        self.work.put(None)
        self.thread.join()


class _Started:
    """A copy the engine was given (staged_schedule's Pending)."""

    def __init__(self, done: threading.Event):
        self.done = done

    def wait(self, deadline) -> None:
        if not self.done.wait(deadline.remaining()):
            raise TimeoutError("a model copy did not finish by the deadline")


def _timed(run, barrier, slowest, iters: int) -> float:
    """The slowest rank's median seconds of ``run()`` over ``iters`` calls after a warm-up."""
    run()
    seconds = []
    for _ in range(iters):
        barrier()
        started = time.perf_counter()
        run()
        seconds.append(slowest(time.perf_counter() - started))
    return statistics.median(seconds)


def _rank(kind: str, rank: int, port: int, gloo_port: int, sizes: list[int], chunk: int, iters: int,
          copy_gbs: float, results) -> None:
    os.environ["PYDIST_HOST_ID"] = f"gpu-check-host{rank}"  # each its own host: the host steps go over TCP
    try:
        results.put((rank, _measure(kind, rank, port, gloo_port, sizes, chunk, iters, copy_gbs)))
    except BaseException as error:  # noqa: BLE001 - reported in the row
        results.put((rank, f"{type(error).__name__}: {error}"))


def _measure(kind: str, rank: int, port: int, gloo_port: int, sizes: list[int], chunk: int, iters: int,
             copy_gbs: float) -> dict:
    import pydist
    from pydist.core.ops import RedOpType, ReduceOp
    from pydist.device import open_device

    timeout = timedelta(seconds=120)
    store = pydist.TCPStore("127.0.0.1", port, SIZE, rank == 0, timeout)
    pydist.init_process_group("pydist", store=store, rank=rank, world_size=SIZE, timeout=timeout)
    host = _ApiHost()
    device = open_device("standin" if kind == "model" else kind, 0, rank)
    found: dict = {"wrong": _edges(device, host), "sizes": {}}

    def slowest(seconds: float) -> float:
        value = np.array([seconds])
        pydist.all_reduce(value, op=ReduceOp(RedOpType.MAX))
        return float(value[0])

    for nbytes in sizes:
        times = {}
        for mode, depth in (("pipelined", 3), ("serial", 1)):
            with _stager(kind, device, host, nbytes, chunk, depth, copy_gbs) as run:
                times[mode] = _timed(run, pydist.barrier, slowest, iters)
        found["sizes"][nbytes] = times
    pydist.destroy_process_group()
    if kind == "cuda":
        found["gloo"] = _gloo(rank, gloo_port, sizes, iters)
    return found


def _gloo(rank: int, port: int, sizes: list[int], iters: int) -> dict | str:
    """torch's gloo all_reduce of a CUDA tensor at each size (seconds), or why not."""
    try:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=SIZE)
    except Exception as error:  # noqa: BLE001 - no gloo here: said in the row
        return f"not run ({type(error).__name__}: {error})"

    def slowest(seconds: float) -> float:
        value = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return float(value[0])

    found = {}
    for nbytes in sizes:
        tensor = torch.ones(nbytes // 4, device="cuda:0")

        def run(t=tensor) -> None:
            dist.all_reduce(t)
            torch.cuda.synchronize()
        found[nbytes] = _timed(run, dist.barrier, slowest, iters)
    dist.destroy_process_group()
    return found


class _ApiHost:
    """The host step over pydist's API on the default group (all the check needs)."""

    def __init__(self) -> None:
        import pydist

        self.pydist, self.rank, self.size = pydist, pydist.get_rank(), pydist.get_world_size()

    def all_reduce(self, array, op) -> None:
        self.pydist.all_reduce(array, op=op)

    def all_gather(self, outputs, input) -> None:
        self.pydist.all_gather(outputs, input)

    def broadcast(self, array, root) -> None:
        self.pydist.broadcast(array, src=root)


def staged_loopback(kind: str = "cuda", sizes: tuple[int, ...] = (64 << 20, 256 << 20), chunk: int = 4 << 20,
                    iters: int = 3, limit: float = 150.0, copy_gbs: float = 0.0) -> Row:
    """Check 8 on a device of ``kind``: (status, detail)."""
    from pydist.testing import free_port

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    port, gloo_port = free_port(), free_port()
    procs = [context.Process(target=_rank, args=(kind, r, port, gloo_port, list(sizes), chunk, iters, copy_gbs,
                                                 results))
             for r in range(SIZE)]
    for proc in procs:
        proc.start()
    found = {}
    deadline = time.monotonic() + limit
    try:
        while len(found) < SIZE and time.monotonic() < deadline:
            try:
                rank, value = results.get(timeout=1.0)
            except queue.Empty:
                if all(proc.exitcode is not None for proc in procs):
                    break
                continue
            found[rank] = value
    finally:
        for proc in procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
    if len(found) < SIZE or any(isinstance(value, str) for value in found.values()):
        return "FAIL", f"ranks' results {found} (exit codes {[proc.exitcode for proc in procs]})"
    return _row(found[0], found[1])


def check(kind: str) -> Row:
    """Check 8 as tools/gpu_check.py runs it: on CUDA at 64 and 256 MiB in 4 MiB chunks; on
    the stand-in at 1 MiB in 64 KiB chunks (the script proven, its times the stand-in's)."""
    if kind == "cuda":
        return staged_loopback("cuda")
    return staged_loopback(kind, sizes=(1 << 20,), chunk=64 << 10, iters=1, limit=120.0)


def _row(first: dict, second: dict) -> Row:
    wrong = first["wrong"] + second["wrong"]
    edges = sum(len(counts) for counts in EDGES.values()) + 2
    parts = [f"{edges} chunk-edge cases " + ("right" if not wrong else f"WRONG: {', '.join(wrong)}")]
    for nbytes, times in first["sizes"].items():
        gbs = {mode: nbytes / seconds / 1e9 for mode, seconds in times.items()}
        text = (f"{_size(nbytes)}: pipelined {times['pipelined'] * 1e3:.1f} ms ({gbs['pipelined']:.2f} GB/s), "
                f"serial {times['serial'] * 1e3:.1f} ms ({gbs['serial']:.2f} GB/s), "
                f"{times['serial'] / times['pipelined']:.2f}x")
        gloo = first.get("gloo")
        if isinstance(gloo, dict):
            text += f", gloo {gloo[nbytes] * 1e3:.1f} ms ({gloo[nbytes] / times['pipelined']:.2f}x gloo's time)"
        parts.append(text)
    if isinstance(first.get("gloo"), str):
        parts.append(f"gloo {first['gloo']}")
    return ("PASS" if not wrong else "FAIL"), "; ".join(parts)


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def _bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("standin", "model", "cuda"), default="cuda",
                        help="model: the throughput runs without a device (numpy memory, a copy thread)")
    parser.add_argument("--sizes", default="64M,256M", help="comma-separated, K/M/G suffixes (default 64M,256M)")
    parser.add_argument("--chunk", default="4M", help="PYDIST_CUDA_CHUNK_BYTES for the throughput runs")
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--copy-gbs", type=float, default=0.0, help="model: the copy engine's rate (GB/s; 0: memcpy's)")
    args = parser.parse_args(argv)
    status, detail = staged_loopback(args.device, tuple(_bytes(s) for s in args.sizes.split(",")),
                                     _bytes(args.chunk), args.iters, limit=600.0, copy_gbs=args.copy_gbs)
    print(f"gpu-check  8 {status:<7} staged path over loopback TCP ({args.device}): {detail}")
    return 0 if status == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
