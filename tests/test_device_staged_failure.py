"""A peer dying in the middle of a staged pipeline: real processes posing as hosts
(PYDIST_HOST_ID), the host steps over TCP, the strict stand-in device. Every survivor raises
naming the dead rank: with the staging driven directly (its pinned buffers all back in the
pool), and through pydist's API (the device engine's rails, staged and send/recv paths; the
survivors' device files gone at their destroy, the dead rank's with them). The seconds each
survivor spent in the call are printed (``-s``), not asserted."""
from __future__ import annotations

import os
import time
from datetime import timedelta

import numpy as np
import pytest
from device_staged_support import ApiHost, make_pool
from device_support import run_ranks

from pydist.algorithms import device_staged_reductions as staged
from pydist.algorithms.device_staging import Staging
from pydist.core.deadline import Deadline
from pydist.core.ops import RedOpType, ReduceOp
from pydist.device import open_device
from pydist.testing import free_port

pytestmark = [pytest.mark.device, pytest.mark.slow]

SIZE, DIES, AT_CHUNK = 3, 1, 3
COUNT = 8 * 1024  # 32 KiB of float32: 8 chunks of 4 KiB


def _rank(kind, rank, link, port):
    import pydist

    os.environ["PYDIST_HOST_ID"] = f"host{rank}"  # every rank its own host: the host steps go over TCP
    timeout = timedelta(seconds=30)
    store = pydist.TCPStore("127.0.0.1", port, SIZE, rank == 0, timeout)
    pydist.init_process_group("pydist", store=store, rank=rank, world_size=SIZE, timeout=timeout)
    device = open_device(kind, 0, rank)

    def trace(stage, index):
        if rank == DIES and stage == "net" and index == AT_CHUNK:
            os._exit(17)  # mid-pipeline: chunk 4 coming down, chunk 2 going up

    staging = Staging(device, device.current_stream(), device.new_stream(), device.new_stream(), make_pool(4096),
                      Deadline.after(60), trace=trace)
    tensor = device.from_host(np.ones(COUNT, np.float32), "float32", staging.caller)
    started = time.monotonic()
    try:
        staged.all_reduce(staging, ApiHost(), tensor, ReduceOp(RedOpType.SUM))
    except Exception as error:  # noqa: BLE001 - the test looks at it
        return type(error).__name__, str(error), staging.pool.out, time.monotonic() - started
    return "no error", "", staging.pool.out, time.monotonic() - started


def test_every_survivor_names_the_peer_that_died_mid_pipeline():
    results = run_ranks("standin", [_rank] * SIZE, free_port(), dies=frozenset({DIES}))
    for rank, found in enumerate(results):
        if rank == DIES:
            continue
        kind, message, out, _seconds = found
        assert kind == "PeerFailedError", (rank, found)
        assert f"rank {DIES}" in message, (rank, message)
        assert out == 0, f"rank {rank}: {out} pinned buffers not back in the pool"


STAGED_ENV = {"PYDIST_CUDA_CHUNK_BYTES": "4096", "PYDIST_CUDA_PINNED_BYTES": "12288",
              "PYDIST_DEVICE_SLOT_BYTES": "4096"}
API_COUNT = 64 * 1024  # 256 KiB of float32: 64 chunks of 4 KiB per rank staging it whole


def _dies_at_chunk(index: int) -> None:
    """From now on this process exits in the host step of chunk ``index`` of its next staged call."""
    original = Staging.run

    def run(self, parts, kind, step, chunks=None):
        def step_or_exit(k, segments):
            if k == index:
                os._exit(17)
            step(k, segments)
        original(self, parts, kind, step_or_exit, chunks)
    Staging.run = run


def _api_rank(kind, rank, link, port, hosts, dies, what):
    """A rank of a job on ``hosts`` (each rank's host): one warm call, then the call ``what``
    ("all_reduce", or "p2p": an exchange with the rank half the group away, on another host)
    during which rank ``dies`` exits mid-pipeline. (error type, message, seconds in the call)."""
    import pydist

    os.environ.update(STAGED_ENV, PYDIST_HOST_ID=f"host{hosts[rank]}")
    timeout = timedelta(seconds=60)
    size = len(hosts)
    store = pydist.TCPStore("127.0.0.1", port, size, rank == 0, timeout)
    pydist.init_process_group("pydist", store=store, rank=rank, world_size=size, timeout=timeout)
    device = open_device(kind, 0, rank)
    stream = device.current_stream()
    tensor = device.from_host(np.ones(API_COUNT, np.float32), "float32", stream)
    pydist.all_reduce(tensor)  # the group's slots, pools and connections made
    device.to_host(tensor, stream, Deadline.after(60))
    if rank == dies:
        _dies_at_chunk(AT_CHUNK)
    started = time.monotonic()
    try:
        if what == "all_reduce":
            pydist.all_reduce(tensor)
        else:
            peer = (rank + size // 2) % size
            works = [pydist.irecv(device.empty((API_COUNT,), "float32"), src=peer), pydist.isend(tensor, dst=peer)]
            for work in works:
                work.wait()
        device.to_host(tensor, stream, Deadline.after(60))
    except Exception as error:  # noqa: BLE001 - the test looks at it
        return type(error).__name__, str(error), time.monotonic() - started
    finally:
        pydist.destroy_process_group()  # its device files go (and the dead rank's, whose creator is gone)
    return "no error", "", time.monotonic() - started


@pytest.mark.parametrize("hosts, what", [([0, 0, 1, 1], "all_reduce"), ([0, 1, 2], "all_reduce"),
                                         ([0, 0, 1, 1], "p2p")], ids=["2x2-rails", "3x1-staged", "2x2-p2p"])
def test_a_peer_dying_mid_call_is_named_by_every_survivor_through_the_api(hosts, what):
    """Through pydist's API (the device engine's staged path): the last rank exits in the host
    step of chunk 4 of its part; every other rank's call raises naming it (an exchange: the
    rank whose partner it was)."""
    dies = len(hosts) - 1
    results = run_ranks("standin", [_api_rank] * len(hosts), free_port(), hosts, dies, what,
                        dies=frozenset({dies}))
    waiting = [(dies + len(hosts) // 2) % len(hosts)] if what == "p2p" else [r for r in range(len(hosts)) if r != dies]
    for rank in waiting:
        kind, message, seconds = results[rank]
        print(f"rank {rank}: {kind} after {seconds:.2f} s: {message[:200]}")
        assert kind in ("PeerFailedError", "OpTimeoutError"), (rank, results[rank])
        assert f"rank {dies}" in message, (rank, message)
