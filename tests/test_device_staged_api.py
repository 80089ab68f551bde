"""Device tensors across hosts through pydist's API (the device engine's dispatch to the staged
path, engines/device_across.py): real processes posing as hosts (PYDIST_HOST_ID), the strict
stand-in, 4 KiB chunks so that every tensor takes several. 2 hosts x 2 ranks (the rails: the
host's device collectives over IPC, each rank's share across hosts), 2 hosts x 1 rank and
2 + 1 ranks (the staged and leaders paths)."""
from __future__ import annotations

import os

import numpy as np
import pytest

import pydist
from pydist.core.deadline import Deadline
from pydist.groups.device_engines import engine_of
from pydist.testing import run_processes

pytestmark = [pytest.mark.device, pytest.mark.slow]

ENV = {"PYDIST_CUDA_CHUNK_BYTES": "4096", "PYDIST_CUDA_PINNED_BYTES": "12288", "PYDIST_DEVICE_SLOT_BYTES": "4096",
       "PYDIST_AUTH_TOKEN": "device-staged-api-test"}
COUNT = 3001  # float32: 3 chunks of 4 KiB and a bit; not divisible by 2 ranks a host


def _standin(rank: int):
    """This rank's stand-in device, ``put(host, dtype)`` (a new device array of it) and ``read(array)``
    (its values), both in order on the device's current stream."""
    from pydist.device import open_device

    device = open_device("standin", 0, rank)
    stream = device.current_stream()

    def put(host: np.ndarray, name: str = "float32"):
        return device.from_host(host, name, stream)

    def read(array) -> np.ndarray:
        return device.to_host(array, stream, Deadline.after(60))

    return device, put, read


def _collectives(rank: int, size: int) -> dict:
    device, put, read = _standin(rank)
    base = np.arange(COUNT, dtype=np.float32) % 97
    found = {}
    tensor = put(base + rank)
    pydist.all_reduce(tensor)
    found["all_reduce"] = read(tensor)
    tensor = put((np.arange(COUNT) * (rank + 1)).astype(np.int64), "int64")
    pydist.all_reduce(tensor, op=pydist.ReduceOp.AVG)
    found["all_reduce avg int64"] = read(tensor)
    tensor = put(base + rank)
    pydist.broadcast(tensor, src=size - 1)
    found["broadcast"] = read(tensor)
    tensor = put(base + rank)
    pydist.reduce(tensor, dst=1, op=pydist.ReduceOp.MAX)
    found["reduce"] = read(tensor)
    output = device.empty((size * 700,), "float32")
    pydist.all_gather_into_tensor(output, put(np.full(700, rank, np.float32)))
    found["all_gather"] = read(output)
    output = device.empty((700,), "float32")
    pydist.reduce_scatter_tensor(output, put(np.arange(size * 700, dtype=np.float32) * (rank + 1)))
    found["reduce_scatter"] = read(output)
    outputs = [device.empty((500,), "float32") for _ in range(size)] if rank == 0 else None
    pydist.gather(put(np.full(500, rank, np.float32)), outputs, dst=0)
    found["gather"] = [read(out) for out in outputs] if outputs is not None else None
    output = device.empty((500,), "float32")
    pydist.scatter(output, [put(np.full(500, 10 + j, np.float32)) for j in range(size)] if rank == 1 else None, src=1)
    found["scatter"] = read(output)
    output = device.empty((size * 600,), "float32")
    pydist.all_to_all_single(output, put(np.repeat(np.arange(size, dtype=np.float32) + 100 * rank, 600)))
    found["all_to_all"] = read(output)
    tensor, output = put(base + rank), device.empty((size * 700,), "float32")
    works = [pydist.all_reduce(tensor, async_op=True),  # on the group's stream, its thread carrying the chunks
             pydist.all_gather_into_tensor(output, put(np.full(700, rank, np.float32)), async_op=True)]
    for work in works:
        work.wait()  # the current stream now waits for the group's
    found["async"] = read(tensor), read(output)
    pydist.barrier()
    return found


def _check(results: list[dict]) -> None:
    size = len(results)
    base = np.arange(COUNT, dtype=np.float32) % 97
    for rank, found in enumerate(results):
        np.testing.assert_array_equal(found["all_reduce"], size * base + sum(range(size)))
        total = np.arange(COUNT) * sum(range(1, size + 1))
        np.testing.assert_array_equal(found["all_reduce avg int64"], total // size)
        np.testing.assert_array_equal(found["broadcast"], base + size - 1)
        np.testing.assert_array_equal(found["reduce"], base + (size - 1 if rank == 1 else rank))
        np.testing.assert_array_equal(found["all_gather"], np.repeat(np.arange(size, dtype=np.float32), 700))
        block = np.arange(rank * 700, (rank + 1) * 700, dtype=np.float32) * sum(range(1, size + 1))
        np.testing.assert_array_equal(found["reduce_scatter"], block)
        if rank == 0:
            for j, out in enumerate(found["gather"]):
                np.testing.assert_array_equal(out, np.full(500, j, np.float32))
        np.testing.assert_array_equal(found["scatter"], np.full(500, 10 + rank, np.float32))
        np.testing.assert_array_equal(found["all_to_all"], np.repeat(np.arange(size) * 100 + rank, 600))
        np.testing.assert_array_equal(found["async"][0], found["all_reduce"])
        np.testing.assert_array_equal(found["async"][1], found["all_gather"])


@pytest.mark.parametrize("hosts, shm", [([0, 0, 1, 1], "1"), ([0, 1], "1"), ([0, 0, 1], "1"), ([0, 0, 1, 1], "0")],
                         ids=["2x2-rails", "2x1-staged", "2+1-leaders", "2x2-no-shm-staged"])
def test_every_collective_across_hosts(hosts, shm):
    """Without shared memory (PYDIST_SHM=0) every rank stages its own, whatever the layout."""
    rank_env = {rank: {"PYDIST_HOST_ID": f"host{host}"} for rank, host in enumerate(hosts)}
    _check(run_processes(len(hosts), _collectives, env={**ENV, "PYDIST_SHM": shm}, rank_env=rank_env, timeout=120))


def _pairs(src: int, dst: int) -> int:
    """Elements of the batch's message from ``src`` to ``dst``: none, 700 or 1400 (int64: 1 to 3 chunks)."""
    return 700 * ((src + dst) % 3)


def _point_to_point(rank: int, size: int) -> dict:
    device, put, read = _standin(rank)
    found = {}
    out = device.empty((COUNT,), "float32")
    works = [pydist.irecv(out, src=(rank - 1) % size), pydist.isend(put(np.arange(COUNT, dtype=np.float32) + rank),
                                                                    dst=(rank + 1) % size)]
    for work in works:
        work.wait()
    found["ring"] = read(out)
    peers = [peer for peer in range(size) if peer != rank]
    outs = {peer: device.empty((_pairs(peer, rank),), "int64") for peer in peers}
    ops = [pydist.P2POp(pydist.irecv, outs[peer], peer, tag=3) for peer in peers]
    ops += [pydist.P2POp(pydist.isend, put(np.arange(_pairs(rank, peer)) + 1000 * rank, "int64"), peer, tag=3)
            for peer in peers]
    for work in pydist.batch_isend_irecv(ops):
        work.wait()
    found["batch"] = {peer: read(out) for peer, out in outs.items()}
    if rank == 0:
        got = {}
        for _ in peers:
            out = device.empty((1500,), "bfloat16")
            source = pydist.recv(out, tag=5)  # from any rank
            got[source] = read(out)
        found["any"] = got
    else:
        pydist.send(put(np.full(1500, rank, np.int16), "bfloat16"), dst=0, tag=5)
    pydist.barrier()
    staged = engine_of(pydist.group.WORLD).staged_p2p
    found["staged"] = sorted(staged.lanes) if staged is not None else []
    return found


def _check_point_to_point(results: list[dict], hosts: list[int]) -> None:
    size = len(results)
    for rank, found in enumerate(results):
        remote = [peer for peer in range(size) if hosts[peer] != hosts[rank]]
        assert found["staged"] == [(way, peer) for way in ("recv", "send") for peer in remote], found["staged"]
        np.testing.assert_array_equal(found["ring"], np.arange(COUNT, dtype=np.float32) + (rank - 1) % size)
        assert sorted(found["batch"]) == [peer for peer in range(size) if peer != rank]
        for peer, got in found["batch"].items():
            np.testing.assert_array_equal(got, np.arange(_pairs(peer, rank)) + 1000 * peer)
    assert sorted(results[0]["any"]) == list(range(1, size))
    for source, got in results[0]["any"].items():
        np.testing.assert_array_equal(got, np.full(1500, source, np.int16))


@pytest.mark.parametrize("hosts", [[0, 0, 1, 1], [0, 1], [0, 0, 1]], ids=["2x2", "2x1", "2+1"])
def test_send_and_recv_across_hosts(hosts):
    """Same-host pairs device to device, the others staged (3 chunks and a bit), a receive from
    any rank taking both kinds, batch_isend_irecv in both directions at once, empty messages."""
    rank_env = {rank: {"PYDIST_HOST_ID": f"host{host}"} for rank, host in enumerate(hosts)}
    _check_point_to_point(run_processes(len(hosts), _point_to_point, env=ENV, rank_env=rank_env, timeout=120), hosts)


def _device_files() -> list[str]:
    """This process's device files in /dev/shm (buffers, ledgers, events)."""
    return sorted(name for name in os.listdir("/dev/shm")
                  if name.startswith("pydist-d") and name.endswith(f"-{os.getpid()}"))


def _destroyed(rank: int, size: int) -> tuple[list[str], list[str]]:
    """A group that ran collectives and send/recv of device tensors (one peer on this host,
    one on another where there is one), then destroyed: its device files before and after."""
    device, put, read = _standin(rank)
    group = pydist.new_group(list(range(size)))
    tensor = put(np.ones(COUNT, np.float32))
    pydist.all_reduce(tensor, group=group)
    for partner in {rank ^ 1, (rank + size // 2) % size} - {rank}:
        works = [pydist.irecv(device.empty((COUNT,), "float32"), src=partner, group=group),
                 pydist.isend(tensor, dst=partner, group=group)]
        for work in works:
            work.wait()
    read(tensor)
    made = _device_files()
    pydist.destroy_process_group(group)
    pydist.barrier()  # every rank has destroyed it (a host barrier: the default group runs no device work)
    return made, _device_files()


@pytest.mark.parametrize("hosts", [[0, 0], [0, 0, 1, 1]], ids=["one host", "2x2"])
def test_destroy_frees_the_groups_device_files(hosts):
    """Buffers, ledgers and events of the slots and of the send/recv channels are removed at
    the group's destroy, not at the process's exit (which multiprocessing's children skip)."""
    rank_env = {rank: {"PYDIST_HOST_ID": f"host{host}"} for rank, host in enumerate(hosts)}
    for rank, (made, left) in enumerate(run_processes(len(hosts), _destroyed, env=ENV, rank_env=rank_env,
                                                      timeout=120)):
        assert made, f"rank {rank} made no device files: the test tests nothing"
        assert left == [], f"rank {rank}: {left} left after the destroy"


def _between_hosts(rank: int, size: int, count: int) -> tuple[set[str], int]:
    """A device all_reduce of ``count`` float32 through the API: the CPU steps between hosts
    this rank ran (NetworkSteps, recorded here) and the bytes they were given."""
    from pydist.engines.device_host_steps import NetworkSteps

    steps: list[tuple[str, int]] = []
    run = NetworkSteps._run

    def recorded(self, collective, algorithm, *args):
        steps.append((collective, sum(arg.nbytes for arg in args if isinstance(arg, np.ndarray))))
        run(self, collective, algorithm, *args)
    NetworkSteps._run = recorded
    device, put, read = _standin(rank)
    tensor = put(np.ones(count, np.float32))
    pydist.all_reduce(tensor)
    assert (read(tensor) == size).all()
    return {name for name, _ in steps}, sum(nbytes for _, nbytes in steps)


@pytest.mark.parametrize("places", [2, 4])
def test_each_byte_crosses_between_hosts_once(places):
    """2 hosts x 2 or 4 ranks, 4000 float32 (16000 bytes, several chunks): each rank gives
    its rail's all_reduce 1/L of the tensor, so a host's ranks put its bytes across once."""
    hosts = [rank // places for rank in range(2 * places)]
    rank_env = {rank: {"PYDIST_HOST_ID": f"host{host}"} for rank, host in enumerate(hosts)}
    for names, nbytes in run_processes(len(hosts), _between_hosts, 4000, env=ENV, rank_env=rank_env, timeout=120):
        assert names == {"all_reduce"} and nbytes == 16000 // places
