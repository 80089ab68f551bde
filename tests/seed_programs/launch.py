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
