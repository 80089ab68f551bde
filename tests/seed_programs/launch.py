"""The seeds' launcher: ``init_process`` and the spawn-and-join ``__main__`` block.

As in seeds 000/001, ``init_process`` sets MASTER_ADDR/MASTER_PORT and calls
``dist.init_process_group(backend, rank=rank, world_size=size)`` before ``fn(rank, size)``.
The port comes from SEED_MASTER_PORT (tests pick a free one, so they can run side by
side) and defaults to the seeds' 29500. ``forked`` is ``spawn`` for the tests: the same
ranks, forked from a fork server that has torch imported already.
"""
from __future__ import annotations

import atexit
import io
import multiprocessing as mp
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

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
    runner, rest = (init_process, (fn,)) if target is None else (target, args)
    return _run(timeout, [ctx.Process(target=_block_buffered, args=(runner, rank, size, *rest))
                                for rank in range(size)])


def _run(timeout, processes):
    """Start ``processes``, join them within ``timeout`` seconds in all, kill (by pid) those
    still alive then; their exit codes."""
    try:
        for p in processes:
            p.start()
        deadline = time.monotonic() + timeout
        for p in processes:
            p.join(max(0.0, deadline - time.monotonic()))
    finally:
        for p in processes:
            if p.is_alive():
                p.kill()
                p.join()
    return [p.exitcode for p in processes]


def forked(size, fn, timeout=60.0, target=None, args=()):
    """``spawn`` for the tests, with warm ranks: each is forked from multiprocessing's fork
    server, which imported numpy, pydist and torch once (the tests set its preload), instead
    of starting an interpreter that imports them again (torch: seconds per rank here).

    A fork server's child inherits the server's environment from when it started, so each
    rank takes this process's environment as it is now, and only then unpickles what it runs
    (seed modules read SEED_TENSORS when imported). Each rank's stdout and stderr go to files
    of its own, written out here whole, rank by rank, once every rank has ended. Ranks still
    alive after ``timeout`` seconds are killed by pid. Returns the exit codes in rank order."""
    ctx = mp.get_context("forkserver")
    call = pickle.dumps((init_process, (fn,)) if target is None else (target, args))
    with tempfile.TemporaryDirectory(prefix="seed-ranks-") as outdir:
        codes = _run(timeout, [ctx.Process(target=_forked_rank, args=(dict(os.environ), call, rank, size, outdir))
                                     for rank in range(size)])
        for rank in range(size):
            for stream, name in ((sys.stdout, "out"), (sys.stderr, "err")):
                path = Path(outdir, f"{rank}.{name}")
                if path.exists():
                    stream.write(path.read_text(errors="replace"))
                    stream.flush()
    return codes


def _forked_rank(environ, call, rank, size, outdir):
    """One rank of ``forked``: this test's environment and output files, then the call, then
    the atexit handlers, as a spawned rank's interpreter runs them when it ends (a forked
    child ends with os._exit, which skips them; pydist's own destroys the groups of a program
    that did not, as the seeds 000 and 001 do not)."""
    os.environ.clear()
    os.environ.update(environ)
    for fd, name in ((1, "out"), (2, "err")):
        with open(os.path.join(outdir, f"{rank}.{name}"), "wb") as file:
            os.dup2(file.fileno(), fd)
    runner, rest = pickle.loads(call)
    try:
        runner(rank, size, *rest)
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()


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
