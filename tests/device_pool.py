"""A pool of pydist ranks as real processes that run many test cases: started once per world size.

``Pool(size, env)`` starts ``size`` worker processes (this file, run as a script; plain
subprocesses, not multiprocessing children), each of which joins one pydist job
(``pydist.init_process_group`` over a TCP store), connects back to the test process, and
then runs the cases it is sent: ``pool.run(fn, *args)`` sends ``fn`` (an importable
function of a test module, called as ``fn(rank, size, *args)``) to every rank and returns
their results in rank order; a rank's exception fails the call with its traceback. A case
that does not finish within ``timeout`` kills the pool (``broken``); so does any failure,
since the other ranks may be left inside a collective. ``kill(rank)`` ends one worker at
once (SIGKILL): the test of a peer that dies. ``close()`` ends the job (each rank destroys
its group) and the processes. Cases of one pool share the job's default group.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")
START_S = 60.0  # only a bound on a hang


class Pool:
    """``size`` pydist ranks serving test cases (module docstring)."""

    def __init__(self, size: int, env: dict[str, str] | None = None, timeout: float = 120.0):
        """``timeout``: the job's group timeout (seconds)."""
        from pydist.testing.processes import free_port

        self.size = size
        self.broken = False
        key = secrets.token_bytes(16)
        address = f"\0pydist-test-pool-{secrets.token_hex(8)}"
        self._listener = Listener(address, "AF_UNIX", authkey=key)
        port = free_port()
        environ = {**os.environ, **(env or {}), "PYTHONPATH": os.pathsep.join([SRC, HERE]),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(size),
                   "POOL_KEY": key.hex(), "POOL_TIMEOUT": str(timeout), "POOL_ADDRESS": address.encode().hex()}
        self.procs = [subprocess.Popen([sys.executable, __file__], env={**environ, "RANK": str(rank)})
                      for rank in range(size)]
        self.links: list[Connection] = [None] * size  # type: ignore[list-item]
        try:
            accepted = [self._accept(START_S) for _ in range(size)]  # the workers then join the job
            for link in accepted:
                if not link.poll(START_S):
                    raise AssertionError(f"pool ranks did not join the job within {START_S} s")
                self.links[link.recv()] = link
        except BaseException:
            self.kill_all()
            raise

    def _accept(self, seconds: float) -> Connection:
        deadline = time.monotonic() + seconds
        self._listener._listener._socket.settimeout(seconds)  # type: ignore[attr-defined]
        while True:
            dead = [rank for rank, proc in enumerate(self.procs) if proc.poll() is not None]
            if dead:
                raise AssertionError(f"pool ranks {dead} exited while starting")
            try:
                return self._listener.accept()
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"pool ranks did not start within {seconds} s") from None

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 120.0) -> list[Any]:
        """``fn(rank, size, *args)`` on every rank; their results, in rank order."""
        assert not self.broken, "the pool broke in an earlier case"
        for link in self.links:
            link.send((fn, args))
        return self.collect(range(self.size), timeout)

    def collect(self, ranks: Any, timeout: float) -> list[Any]:
        """The replies of ``ranks`` to the last case (the pool breaks on a failure or a hang)."""
        deadline = time.monotonic() + timeout
        results: dict[int, Any] = {}
        failures = []
        for rank in ranks:
            link = self.links[rank]
            if not link.poll(max(0.0, deadline - time.monotonic())):
                self.kill_all()
                raise AssertionError(f"pool rank {rank} did not finish its case within {timeout} s")
            ok, value = link.recv()
            if not ok:
                failures.append(f"rank {rank} failed:\n{value}")
            results[rank] = value
        if failures:
            self.kill_all()
            raise AssertionError("\n".join(failures))
        return [results[rank] for rank in ranks]

    def send(self, rank: int, fn: Callable[..., Any], *args: Any) -> None:
        """Start ``fn`` on one rank only (``collect`` its reply)."""
        self.links[rank].send((fn, args))

    def kill(self, rank: int) -> None:
        """SIGKILL one rank now."""
        self.procs[rank].send_signal(signal.SIGKILL)
        self.procs[rank].wait()

    def kill_all(self) -> None:
        self.broken = True
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self._listener.close()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the job and the processes."""
        if self.broken:
            return
        try:
            for link, proc in zip(self.links, self.procs):
                if proc.poll() is None:
                    link.send(None)
            for proc in self.procs:
                proc.wait(START_S)
        finally:
            self.kill_all()


def _serve() -> None:
    """A worker: join the job, then run cases until told to stop."""
    import pydist

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    address, key = bytes.fromhex(os.environ["POOL_ADDRESS"]).decode(), bytes.fromhex(os.environ["POOL_KEY"])
    link = Client(address, "AF_UNIX", authkey=key)
    pydist.init_process_group("pydist", timeout=timedelta(seconds=float(os.environ["POOL_TIMEOUT"])))
    link.send(rank)
    while True:
        case = link.recv()
        if case is None:
            break
        fn, args = case
        try:
            link.send((True, fn(rank, size, *args)))
        except BaseException:  # noqa: BLE001 - reported to the test
            link.send((False, traceback.format_exc()))
    pydist.destroy_process_group()


if __name__ == "__main__":
    _serve()
