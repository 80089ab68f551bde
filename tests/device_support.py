"""What the device tests share: the implementations to run over, and ranks as processes.

``KINDS`` are the device implementations as pytest parameters: the strict stand-in always,
torch-cpu where torch imports, cuda where a GPU is present (``gpu``-marked). ``run_ranks``
runs one function per rank in its own process (forkserver, as pydist.testing does; CUDA
cannot fork), each given (kind, rank, link, *args), where ``link`` carries host messages to
the other ranks (the control plane the engine has; never a sleep as synchronisation).
"""
from __future__ import annotations

import multiprocessing
import queue
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pydist.core.buffers import bf16_bits_to_float32, float32_to_bf16_bits
from pydist.device import unavailable
from pydist.device.dtypes import DTYPES, dtype
from pydist.testing import stop_processes

JOIN_S = 60.0  # only a bound on a hang, never a measurement

#: (A kind that cannot run here is skipped by ``require``: deciding it at import would import
#: torch in every rank process, seconds each on a loaded machine.)
KINDS = [
    pytest.param("standin", id="standin"),
    pytest.param("torch-cpu", id="torch-cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]
#: Kinds where a record can be outstanding (work still to run after the host moved on).
ASYNC = ("standin", "cuda")

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["numpy", "pydist"])


def require(kind: str) -> None:
    """Skip the test when a device of ``kind`` cannot be made here."""
    reason = unavailable(kind)
    if reason is not None:
        pytest.skip(reason)


class Link:
    """Host messages between the ranks of a test: ``send(to, value)``, ``recv(frm)``."""

    def __init__(self, rank: int, inboxes: list[Any]):
        self.rank = rank
        self._inboxes = inboxes

    def send(self, to: int, value: Any) -> None:
        self._inboxes[to].put((self.rank, value))

    def recv(self, frm: int, timeout: float = JOIN_S) -> Any:
        sender, value = self._inboxes[self.rank].get(timeout=timeout)
        assert sender == frm, f"rank {self.rank} expected a message from rank {frm}, got one from rank {sender}"
        return value


def _child(fn: Callable[..., Any], kind: str, rank: int, inboxes: list[Any], results: Any, args: tuple) -> None:
    try:
        results.put((rank, True, fn(kind, rank, Link(rank, inboxes), *args)))
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put((rank, False, traceback.format_exc()))


def run_ranks(kind: str, functions: list[Callable[..., Any]], *args: Any, dies: frozenset[int] = frozenset(),
              timeout: float = JOIN_S) -> list[Any]:
    """Run ``functions[r](kind, r, link, *args)`` in a process per rank; their results (a
    rank's exception fails the test with its traceback). Ranks in ``dies`` exit on purpose."""
    require(kind)
    inboxes = [_CONTEXT.Queue() for _ in functions]
    results = _CONTEXT.Queue()
    procs = [_CONTEXT.Process(target=_child, args=(fn, kind, rank, inboxes, results, args))
             for rank, fn in enumerate(functions)]
    for proc in procs:
        proc.start()
    found: dict[int, Any] = {}
    try:
        while len(found) < len(functions) - len(dies):
            try:
                rank, ok, value = results.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"ranks {sorted(set(range(len(functions))) - set(found) - dies)} "
                                     f"did not finish within {timeout} s") from None
            assert ok, f"rank {rank} failed:\n{value}"
            found[rank] = value
    finally:
        stop_processes(procs, timeout)
        for channel in [*inboxes, results]:
            channel.close()
            channel.join_thread()
    return [found.get(rank) for rank in range(len(functions))]


def sample(name: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Values of dtype ``name`` as the host holds them (bfloat16 as int16 bits): small
    integers and halves for the floats (exact in every float type), the full range for the
    integers (so that sums and products wrap), random for bool."""
    rng = np.random.default_rng(seed)
    kind = dtype(name)
    if kind.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if kind.kind == "f":
        values = rng.integers(-16, 17, shape) / 2.0
        return float32_to_bf16_bits(values.astype(np.float32)) if name == "bfloat16" else values.astype(kind.compute)
    info = np.iinfo(kind.compute)
    return rng.integers(info.min, info.max, shape, dtype=kind.compute, endpoint=True)


def values(host: np.ndarray, name: str) -> np.ndarray:
    """The numbers a host array of dtype ``name`` holds (bfloat16 bits widened)."""
    return bf16_bits_to_float32(host) if name == "bfloat16" else host


NAMES = list(DTYPES)
