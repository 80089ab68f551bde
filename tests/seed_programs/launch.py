"""The seeds' launcher: ``init_process`` and the spawn-and-join ``__main__`` block.

As in seeds 000/001, ``init_process`` sets MASTER_ADDR/MASTER_PORT and calls
``dist.init_process_group(backend, rank=rank, world_size=size)`` before ``fn(rank, size)``.
The port comes from SEED_MASTER_PORT (tests pick a free one, so they can run side by
side) and defaults to the seeds' 29500.
"""
from __future__ import annotations

import io
import multiprocessing as mp
import os
import sys
import time

import pydist as dist


def init_process(rank, size, fn, backend="pydist"):
    """ Initialize the distributed environment. """
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ['MASTER_PORT'] = os.environ.get('SEED_MASTER_PORT', '29500')
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)
    sys.stdout.flush()


def _block_buffered(target, *args):
    """Run ``target(*args)`` with stdout block-buffered and flushed once at the end.

    Not part of the seeds: it keeps concurrent ranks' output whole. multiprocessing passes
    ``python -u`` on to its children, which then write every piece of a print (each
    argument, separator and newline) with its own write(), so lines of ranks interleave.
    """
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False), 1 << 16))
    try:
        target(*args)
    finally:
        sys.stdout.flush()


def spawn(size, fn, timeout=60.0, target=None, args=()):
    """The seeds' main block: start method "spawn", one Process per rank, join them all.

    Each rank runs ``init_process(rank, size, fn)``, or ``target(rank, size, *args)`` when
    ``target`` is given. Ranks still alive after ``timeout`` seconds are killed by pid.
    Returns the exit codes in rank order (a killed rank shows -9)."""
    ctx = mp.get_context("spawn")
    processes = []
    try:
        for rank in range(size):
            if target is None:
                p = ctx.Process(target=_block_buffered, args=(init_process, rank, size, fn))
            else:
                p = ctx.Process(target=_block_buffered, args=(target, rank, size, *args))
            p.start()
            processes.append(p)
        deadline = time.monotonic() + timeout
        for p in processes:
            p.join(max(0.0, deadline - time.monotonic()))
    finally:
        for p in processes:
            if p.is_alive():
                p.kill()
                p.join()
    return [p.exitcode for p in processes]


def main(size, fn):
    """``if __name__ == "__main__":`` of the seeds."""
    codes = spawn(size, fn)
    print('finished', codes)
    return 0 if all(code == 0 for code in codes) else 1


def slow_init_rank(rank, size, delay):
    """Like seed 000 (rank 0 sends and returns, the others receive), except that ranks other
    than 0 are ``delay`` seconds slower at their last store write in init_process_group (its
    progress record): rank 0, which hosts the store, may be gone by then unless
    init_process_group waits for every rank."""
    import numpy as np

    from pydist.groups import progress as _progress
    if rank != 0:
        publish = _progress.ProgressBoard._publish

        def slow_publish(self):
            time.sleep(delay)
            publish(self)
        _progress.ProgressBoard._publish = slow_publish
    os.environ['MASTER_ADDR'] = '127.0.0.1'
    os.environ['MASTER_PORT'] = os.environ.get('SEED_MASTER_PORT', '29500')
    dist.init_process_group("pydist", rank=rank, world_size=size)
    tensor = np.full(4, 1.0 if rank == 0 else 0.0, np.float32)
    if rank == 0:
        dist.send(tensor, dst=1)
    elif rank == 1:
        dist.recv(tensor, src=0)
    print(f"Rank: {rank}, has data {tensor}")
