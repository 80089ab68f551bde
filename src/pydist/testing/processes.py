"""Ranks as real processes (see pydist.testing)."""
from __future__ import annotations

import multiprocessing
import os
import queue
import random
import socket
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from ..net.addresses import family_of, host_port
from .threads import RankFailed

_CONTEXT = multiprocessing.get_context("forkserver")


def preload(*modules: str) -> None:
    """Have the fork server that starts process-ranks import ``modules`` as well as numpy and
    pydist, once, so that no rank imports them itself (e.g. "torch": seconds a rank); then
    pydist.testing._frozen, so that the ranks do not copy what they imported. Takes effect
    only if called before the server starts (at the first rank of this process)."""
    _CONTEXT.set_forkserver_preload(["numpy", "pydist", *modules, "pydist.testing._frozen"])


preload()


def start_ranks(target: Callable[..., Any], size: int, *args: Any) -> tuple[list, Any]:
    """Start ``target(rank, size, port, queue, *args)`` in ``size`` processes meeting on a
    fresh port; (the processes, the queue they may report on). For tests that kill ranks."""
    queue, port = _CONTEXT.Queue(), free_port()
    procs = [_CONTEXT.Process(target=target, args=(rank, size, port, queue, *args)) for rank in range(size)]
    for proc in procs:
        proc.start()
    return procs, queue


#: Where free_port looks first: below Linux's default ephemeral range (32768-60999), which
#: the kernel hands to outgoing connections, so a port chosen there can be taken by any
#: client socket of a busy test run before the test binds it.
QUIET_PORTS = range(20000, 32768)


def stop_processes(procs: Sequence[Any], grace: float) -> None:
    """Join each of ``procs`` (multiprocessing Processes) within ``grace`` seconds, then
    SIGKILL (by pid) and reap each one still running: none is left behind."""
    for proc in procs:
        proc.join(grace)
        if proc.is_alive():
            proc.kill()
            proc.join()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host`` (an IPv4 or IPv6 address): a random
    one of QUIET_PORTS that binds, else one the kernel picks."""
    for port in random.sample(QUIET_PORTS, 20):
        with socket.socket(family_of(host)) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(family_of(host)) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _init(rank: int, world_size: int, init: str, address: str, pg_timeout: float, host: str):
    """init_process_group the way ``init`` says; returns the module whose destroy_process_group ends it."""
    import pydist
    timeout = timedelta(seconds=pg_timeout)
    if init in ("env", "torch", "gloo") or init.startswith("torch:"):
        os.environ.update(MASTER_ADDR=host, MASTER_PORT=address, RANK=str(rank), WORLD_SIZE=str(world_size))
        if init != "env":  # torch.distributed on pydist's plugin, or on torch's gloo, or a backend string
            import torch.distributed as tdist

            import pydist.torch  # noqa: F401
            backend = {"torch": "pydist", "gloo": "gloo"}.get(init, init.removeprefix("torch:"))
            tdist.init_process_group(backend, timeout=timeout)
            return tdist
        pydist.init_process_group("pydist", timeout=timeout)
    elif init == "store":
        store = pydist.TCPStore(host, int(address), world_size, rank == 0, timeout)
        pydist.init_process_group("pydist", store=store, rank=rank, world_size=world_size, timeout=timeout)
    else:
        pydist.init_process_group("pydist", init_method=address, rank=rank, world_size=world_size, timeout=timeout)
    return pydist


def _child(rank: int, world_size: int, init: str, address: str, pg_timeout: float, host: str, env: dict, results, fn,
           args, kwargs) -> None:
    os.environ.update(env)
    try:
        module = _init(rank, world_size, init, address, pg_timeout, host)
        value = fn(rank, world_size, *args, **kwargs)
        module.destroy_process_group()
        results.put((rank, True, value))
    except BaseException as error:  # noqa: BLE001 - reported to the parent
        results.put((rank, False, f"{type(error).__name__}: {error}\n{traceback.format_exc()}"))


def run_processes(world_size: int, fn: Callable[..., Any], *args: Any, init: str = "env", timeout: float = 60.0,
                  pg_timeout: float = 30.0, env: dict[str, str] | None = None,
                  rank_env: dict[int, dict[str, str]] | None = None, host: str = "127.0.0.1",
                  **kwargs: Any) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` (importable, picklable) in ``world_size``
    processes after init_process_group by ``init``: "env", "tcp", "file" or "store" (pydist's),
    or "torch" (torch.distributed.init_process_group("pydist") through the plugin), or "gloo"
    (torch.distributed on torch's gloo, to compare with), or "torch:<backend string>"
    (init_process_group("cpu:pydist,cuda:gloo") for "torch:cpu:pydist,cuda:gloo");
    ``env`` is added to each process's environment first, then ``rank_env[rank]`` (e.g.
    PYDIST_HOST_ID, so that one machine poses as several hosts); ``host``: the address of the
    store (MASTER_ADDR), e.g. "::1" for IPv6."""
    port = free_port(host)
    tmpdir = None
    if init in ("env", "torch", "gloo", "store") or init.startswith("torch:"):
        address = str(port)
    elif init == "tcp":
        address = f"tcp://{host_port(host, port)}"
    elif init == "file":
        tmpdir = tempfile.TemporaryDirectory(prefix="pydist-test-")
        address = f"file://{tmpdir.name}/store"
    else:
        raise ValueError(f"init: expected env, tcp, file, store, torch or gloo, got {init!r}")
    results = _CONTEXT.Queue()
    envs = [{**(env or {}), **(rank_env or {}).get(r, {})} for r in range(world_size)]
    procs = [_CONTEXT.Process(target=_child, args=(r, world_size, init, address, pg_timeout, host, envs[r], results, fn,
                                                   args, kwargs),
                              name=f"pydist-rank-{r}") for r in range(world_size)]
    for proc in procs:
        proc.start()
    collected: dict[int, tuple[bool, Any]] = {}
    try:
        deadline = time.monotonic() + timeout  # real time: the harness's bound on real processes
        while len(collected) < world_size:
            try:
                rank, ok, value = results.get(timeout=min(0.2, max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                dead = [r for r, proc in enumerate(procs) if r not in collected and proc.exitcode is not None]
                if dead:
                    try:  # a result may still be in the pipe
                        rank, ok, value = results.get(timeout=0.5)
                    except queue.Empty:
                        code = procs[dead[0]].exitcode
                        collected[dead[0]] = (False, f"process exited with code {code} without reporting a result")
                        break
                elif time.monotonic() >= deadline:
                    missing = sorted(set(range(world_size)) - collected.keys())
                    raise TimeoutError(f"process-ranks {missing} did not finish within {timeout} s") from None
                else:
                    continue
            collected[rank] = (ok, value)
            if not ok:
                break
    finally:
        stop_processes(procs, 5 if len(collected) == world_size else 0.5)
        results.close()
        if tmpdir is not None:
            tmpdir.cleanup()
    failed = sorted(rank for rank, (ok, _) in collected.items() if not ok)
    if failed:
        raise RankFailed(failed[0], collected[failed[0]][1])
    return [collected[rank][1] for rank in range(world_size)]
