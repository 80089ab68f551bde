"""gpu-check 8 (issue 47 item 6.8): the staged path of device tensors over loopback TCP.

Ranks on one device, each group of them posing as a host (PYDIST_HOST_ID), so that what
crosses between "hosts" goes through pinned memory and pydist's TCP transport:

- chunk edges, through pydist's API (the device engine's path across hosts): every
  collective and send/recv (gpu_check_engine's check-4 cases) for float32, bfloat16 and
  int64 at 1 B and around 1 and 3 chunks of 4 KiB (PYDIST_CUDA_CHUNK_BYTES=4096), on 2
  hosts x 2 ranks (the rails: the host's device collectives, each rank's share across
  hosts) and 2 hosts x 1 rank (each rank stages its own), element by element;
- throughput at each size (default 64 and 256 MiB of float32, 4 MiB chunks), 2 hosts x 1
  rank: the staged all_reduce (pydist.algorithms.device_staged_reductions) pipelined (3
  chunks in flight, copies down and up on their own streams) against serial (one stage at
  a time, the same pool), the slowest rank's median of ``iters`` calls after a warm-up; on
  CUDA also torch's gloo all_reduce of the same CUDA tensor (the whole tensor through
  pinned memory, gloo's way) when torch has gloo.

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
import os
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "src"))
sys.path.insert(0, HERE)
import gpu_check_engine as engine  # noqa: E402 - after the path it needs

Row = tuple[str, str]  # (status, detail)
SIZE = 2
#: the edges' staging: 4 KiB chunks, three in flight
EDGE_ENV = {"PYDIST_CUDA_CHUNK_BYTES": "4096", "PYDIST_CUDA_PINNED_BYTES": "12288"}
#: bytes of each whole buffer (as check 4 counts them): 1 B, one chunk, one and a bit, three and a bit
EDGE_SIZES = [1, 4096, 4096 + 64, 3 * 4096 + 64]
#: each rank's host
LAYOUTS = {"2 hosts x 2 ranks": [0, 0, 1, 1], "2 hosts x 1 rank": [0, 1]}


def _hosts(layout: list[int]) -> dict[int, dict[str, str]]:
    return {rank: {"PYDIST_HOST_ID": f"gpu-check-host{host}"} for rank, host in enumerate(layout)}


def edges(kind: str) -> tuple[list[str], str]:
    """Every collective and send/recv through pydist's API at the chunk edges on each layout:
    (the wrong ones, what ran)."""
    wrong = []
    for name, layout in LAYOUTS.items():
        for ranked in engine.run_ranks(len(layout), engine.wrong_collectives, kind, EDGE_SIZES, limit=240,
                                       env=EDGE_ENV, rank_env=_hosts(layout)):
            wrong += [f"{what} on {name}" for what in ranked]
    sizes = ", ".join(f"{size} B" for size in EDGE_SIZES)
    return wrong, (f"every collective and send/recv x {len(engine.NAMES)} dtypes x {sizes} in 4 KiB chunks on "
                   f"{' and '.join(LAYOUTS)}")


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
        copier = _CopyEngine(copy_gbs)
        try:
            yield lambda: copier.all_reduce(np.ones(nbytes // 4, np.float32), host, op, chunk, depth)
        finally:
            copier.close()
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


def _measure(rank: int, size: int, kind: str, gloo_port: int, sizes: list[int], chunk: int, iters: int,
             copy_gbs: float) -> dict:
    """A rank's throughput: the slowest rank's seconds at each size, pipelined and serial (and gloo's)."""
    import pydist
    from pydist.core.ops import RedOpType, ReduceOp
    from pydist.device import open_device

    host = _ApiHost()
    device = open_device("standin" if kind == "model" else kind, 0, rank)
    found: dict = {"sizes": {}}

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
    """The throughput half of check 8 on a device of ``kind``: (status, detail)."""
    from pydist.testing import free_port

    try:
        first = engine.run_ranks(SIZE, _measure, kind, free_port(), list(sizes), chunk, iters, copy_gbs, limit=limit,
                                 rank_env=_hosts(list(range(SIZE))))[0]
    except RuntimeError as error:
        return "FAIL", str(error)
    return "PASS", _throughput(first)


def check(kind: str, sizes: tuple[int, ...] | None = None, chunk: int | None = None, iters: int | None = None,
          copy_gbs: float = 0.0) -> Row:
    """Check 8 on a device of ``kind``: the edges, then the throughput (by default on CUDA at
    64 and 256 MiB in 4 MiB chunks, 3 calls; elsewhere at 1 MiB in 64 KiB chunks, 1 call:
    the script proven, its times the stand-in's)."""
    wrong, ran = edges("standin" if kind == "model" else kind)
    cuda = kind == "cuda"
    status, detail = staged_loopback(kind, sizes or ((64 << 20, 256 << 20) if cuda else (1 << 20,)),
                                     chunk or (4 << 20 if cuda else 64 << 10), iters or (3 if cuda else 1),
                                     limit=300.0 if cuda else 120.0, copy_gbs=copy_gbs)
    text = f"{ran}: " + ("right" if not wrong else f"{len(wrong)} WRONG: {'; '.join(wrong[:6])}")
    return ("PASS" if status == "PASS" and not wrong else "FAIL"), f"{text}; {detail}"


def _throughput(first: dict) -> str:
    parts = []
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
    return "; ".join(parts)


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def _bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("standin", "model", "cuda"), default="cuda",
                        help="model: the throughput runs without a device (numpy memory, a copy thread)")
    parser.add_argument("--sizes", help="comma-separated, K/M/G suffixes (default: check 8's)")
    parser.add_argument("--chunk", help="the chunk of the throughput runs (default: check 8's)")
    parser.add_argument("--iters", type=int)
    parser.add_argument("--copy-gbs", type=float, default=0.0, help="model: the copy engine's rate (GB/s; 0: memcpy's)")
    args = parser.parse_args(argv)
    sizes = tuple(_bytes(s) for s in args.sizes.split(",")) if args.sizes else None
    status, detail = check(args.device, sizes, _bytes(args.chunk) if args.chunk else None, args.iters, args.copy_gbs)
    print(f"gpu-check  8 {status:<7} staged path over loopback TCP ({args.device}): {detail}")
    return 0 if status == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
