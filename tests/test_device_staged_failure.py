"""A peer dying in the middle of a staged pipeline: real processes, each posing as its own host
(PYDIST_HOST_ID), the host steps over TCP, the strict stand-in device. Every survivor raises
naming the dead rank, and its pinned buffers are all back in the pool."""
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
