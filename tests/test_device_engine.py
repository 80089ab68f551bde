"""The device engine's semantics through pydist's API, on the strict stand-in, ranks as real
processes (one pool of 3 for most): NCCL's streams (async_op on the group's stream, wait()
making the current stream wait, get_future), a tensor dropped right after an async call,
non-contiguous tensors, ranks on their own devices, the barrier, desynchronised ranks, bad
input named at the call, a build mismatch, the buffers released at destroy, and a peer killed
during a device collective: every survivor names it (the watchdog too, after the call)."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest
from device_cases import inputs, same
from device_pool import Pool
from test_device_collectives import ENV, device, down, up

import pydist
from pydist.core.deadline import Deadline
from pydist.device.dtypes import is_poison

pytestmark = [pytest.mark.device, pytest.mark.slow]


@pytest.fixture(scope="module")
def pool():
    made = Pool(3, ENV)
    yield made
    made.close()


# -- streams ------------------------------------------------------------------------------------

def async_case(rank, size):
    dev = device(rank)
    caller = dev.current_stream()
    x = up(rank, inputs("float32", 3000, rank, 20), "float32")
    work = pydist.all_reduce(x, async_op=True)
    enqueued_then = work.is_completed()  # the stand-in has run nothing yet: nobody waited
    work.wait()  # the caller's stream now waits for the group's: reading on it sees the result
    after_wait = dev.to_host(x, caller, Deadline.after(60))
    y = up(rank, inputs("int32", 50, rank, 21), "int32")
    future = pydist.all_reduce(y, async_op=True).get_future()
    outputs = future.result(timeout=60)  # set once the device part is done
    got = dev.to_host(outputs[0], dev.new_stream(), Deadline.after(60))  # any stream: it is done
    return enqueued_then, after_wait, got


def test_async_runs_on_the_group_stream_and_wait_orders_the_callers_stream(pool):
    results = pool.run(async_case)
    first = sum(inputs("float32", 3000, r, 20) for r in range(3))
    second = sum(inputs("int32", 50, r, 21) for r in range(3))
    for enqueued_then, after_wait, got in results:
        assert not enqueued_then
        assert same(after_wait, first) and same(got, second)


def missing_wait_case(rank, size):
    """The caller reads on its own stream without waiting for the async call: it reads the
    tensor as it was (the group's stream has not run), never the result."""
    dev = device(rank)
    x = up(rank, np.full(8, float(rank + 1), np.float32), "float32")
    work = pydist.all_reduce(x, async_op=True)
    early = dev.to_host(x, dev.current_stream(), Deadline.after(60))
    work.wait()
    late = dev.to_host(x, dev.current_stream(), Deadline.after(60))
    return early, late


def test_reading_without_waiting_for_the_work_does_not_see_the_result(pool):
    for rank, (early, late) in enumerate(pool.run(missing_wait_case)):
        assert (early == rank + 1).all() and (late == 6).all()


def dropped_case(rank, size):
    """Inputs dropped right after an async call: kept from reuse until the group's stream is
    past them (the stand-in raises DeviceError when work runs on a dropped array otherwise)."""
    dev = device(rank)
    out = dev.empty((size, 500), "int64")
    source = up(rank, inputs("int64", 500, rank, 22), "int64")
    work = pydist.all_gather_into_tensor(out, source, async_op=True)
    del source
    work.wait()
    return down(rank, out)


def test_an_input_dropped_right_after_an_async_call(pool):
    expected = np.stack([inputs("int64", 500, r, 22) for r in range(3)])
    for got in pool.run(dropped_case):
        assert same(got, expected)


# -- layouts and devices --------------------------------------------------------------------------

def strided_case(rank, size):
    host = inputs("float32", 40 * 30, rank, 23).reshape(40, 30)
    x = up(rank, host, "float32")
    pydist.all_reduce(x[::2, 1::3])  # a non-contiguous view: through a contiguous copy and back
    return down(rank, x)


def test_a_non_contiguous_tensor(pool):
    hosts = [inputs("float32", 40 * 30, r, 23).reshape(40, 30) for r in range(3)]
    for rank, got in enumerate(pool.run(strided_case)):
        expected = hosts[rank].copy()
        expected[::2, 1::3] = sum(h[::2, 1::3] for h in hosts)
        assert same(got, expected)


def own_device_case(rank, size):
    """A group whose ranks each use their own (stand-in) device."""
    group = pydist.new_group(list(range(size)))
    dev = device(rank, index=rank + 1)
    x = dev.from_host(inputs("bfloat16", 2000, rank, 24), "bfloat16", dev.current_stream())
    pydist.all_reduce(x, group=group)
    got = dev.to_host(x, dev.current_stream(), Deadline.after(60))
    with pytest.raises(ValueError, match=f"on standin:0, but this rank's group runs its device tensors on "
                                         f"standin:{rank + 1}"):
        pydist.all_reduce(up(rank, np.zeros(2, np.float32), "float32"), group=group)
    pydist.destroy_process_group(group)
    return got, dev.uuid


def test_ranks_on_their_own_devices(pool):
    from device_cases import reduced
    results = pool.run(own_device_case)
    expected = reduced([inputs("bfloat16", 2000, r, 24) for r in range(3)], "SUM", "bfloat16", 3)
    assert all(same(got, expected) for got, _ in results)
    assert len({uuid for _, uuid in results}) == 3


def barrier_case(rank, size):
    x = up(rank, np.full(4, rank, np.int32), "int32")
    pydist.all_reduce(x)
    pydist.barrier()  # the group runs device tensors: its work so far is done on every rank
    return down(rank, x)


def test_the_barrier_of_a_group_on_devices(pool):
    assert all((got == 3).all() for got in pool.run(barrier_case))


# -- misuse ---------------------------------------------------------------------------------------

def bad_input_case(rank, size):
    x = up(rank, np.zeros(6, np.float32), "float32")
    with pytest.raises(ValueError, match=r"tensor_list\[1\] is on the host \(CPU memory\) while tensor is on "
                                         "standin:0"):
        pydist.all_gather([x, np.zeros(6, np.float32), x], x)
    with pytest.raises(ValueError, match=r"tensor_list\[0\]: a tensor on standin:0 among tensors in host memory"):
        pydist.all_gather([x, x, x], np.zeros(6, np.float32))
    other = device(rank, index=7)
    elsewhere = other.from_host(np.zeros(6, np.float32), "float32", other.current_stream())
    with pytest.raises(ValueError, match="output_tensor is on standin:7 while input_tensor is on standin:0"):
        pydist.all_gather_into_tensor(elsewhere, x)
    with pytest.raises(ValueError, match="on standin:7, but this rank's group runs its device tensors on standin:0"):
        pydist.all_reduce(elsewhere)
    with pytest.raises(TypeError, match="dtype int32 differs from input_tensor's float32"):
        pydist.all_gather_into_tensor(up(rank, np.zeros(18, np.int32), "int32"), x)
    with pytest.raises(TypeError, match="BAND"):
        pydist.all_reduce(x, op=pydist.ReduceOp.BAND)
    with pytest.raises(ValueError, match="expected 3 x 6 = 18 elements"):
        pydist.all_gather_into_tensor(up(rank, np.zeros(17, np.float32), "float32"), x)
    pydist.all_reduce(x)  # the group still works: nothing was sent
    return down(rank, x)


def test_bad_input_is_named_at_the_call(pool):
    assert all((got == 0).all() for got in pool.run(bad_input_case))


def desync_case(rank, size):
    x = up(rank, np.ones(4, np.float32), "float32")
    call = (lambda: pydist.broadcast(x, src=0)) if rank == 0 else (lambda: pydist.all_reduce(x))
    return _error_of(call)


def _error_of(call) -> str:
    """What ``call`` raised (DistBackendError expected)."""
    with pytest.raises(pydist.DistBackendError) as raised:
        call()
    return str(raised.value)


def test_ranks_in_different_calls_fail_instead_of_mixing_data():
    with Pool(2, ENV, timeout=60) as pool:
        messages = pool.run(desync_case)
    assert all("called different operations" in message for message in messages), messages


def build_case(rank, size):
    dev = device(rank, index=9)
    if rank == 1:
        dev._build = "standin, another build"  # as a rank whose CUDA or torch differs
    group = pydist.new_group(list(range(size)))
    ones = dev.from_host(np.ones(2, np.float32), "float32", dev.current_stream())
    return _error_of(lambda: pydist.all_reduce(ones, group=group))


def test_a_build_mismatch_is_named_by_every_rank():
    with Pool(2, ENV, timeout=60) as pool:
        messages = pool.run(build_case)
    for message in messages:
        assert "rank 1 runs standin, another build" in message and "rank 0 runs standin" in message, message


# -- failures and release ---------------------------------------------------------------------------

def looping_case(rank, size, flag, stop=False):
    """all_reduce until it fails; at the 20th round rank 1 marks it (and, ``stop``, stops
    itself: SIGSTOP); (when it failed, what it said)."""
    import signal
    x = up(rank, np.ones(3000, np.float32), "float32")
    try:
        for round_ in range(100000):
            pydist.all_reduce(x)
            down(rank, x[:1])
            if round_ == 20 and rank == 1:
                open(flag, "w").close()
                if stop:
                    os.kill(os.getpid(), signal.SIGSTOP)
    except Exception as error:  # noqa: BLE001 - what the survivor saw
        return time.monotonic(), f"{type(error).__name__}: {error}"
    return time.monotonic(), "no error"


def test_a_peer_killed_during_device_collectives_is_named_by_every_survivor(tmp_path):
    """Measured here: the time from the SIGKILL to each survivor's error (reported by -s)."""
    flag = str(tmp_path / "twenty")
    with Pool(3, ENV, timeout=60) as pool:
        for rank in range(3):
            pool.send(rank, looping_case, flag)
        deadline = time.monotonic() + 60
        while not os.path.exists(flag):
            assert time.monotonic() < deadline, "the ranks never reached their 20th round"
            time.sleep(0.01)
        killed_at = time.monotonic()
        pool.kill(1)
        survivors = pool.collect([0, 2], timeout=60)
    for rank, (failed_at, message) in zip([0, 2], survivors):
        print(f"rank {rank}: {failed_at - killed_at:.3f} s after the kill: {message[:200]}")
        assert "rank 1" in message and "Timed out" not in message, message
        assert failed_at - killed_at < 60  # before the group's timeout: the death was seen, not waited out


def test_a_frozen_peer_is_named_by_every_survivor(tmp_path):
    """A stopped process never runs its device work nor answers: the survivors name it once
    it is declared dead (PYDIST_PEER_TIMEOUT, 1 s here), not at the group's timeout."""
    flag = str(tmp_path / "stopped")
    with Pool(3, {**ENV, "PYDIST_PEER_TIMEOUT": "1"}, timeout=60) as pool:
        for rank in range(3):
            pool.send(rank, looping_case, flag, True)
        survivors = pool.collect([0, 2], timeout=60)
        assert os.path.exists(flag)
        pool.kill(1)
    for _, message in survivors:
        assert "rank 1" in message and "Timed out" not in message, message


def watchdog_case(rank, size, flag):
    """Rank 0's call returns with its work enqueued; rank 1 dies before its work ran (nobody
    asked the stand-in to run it); rank 0's watchdog names rank 1, and so does its next call."""
    from pydist.groups.device_engines import engine_of
    x = up(rank, np.ones(4, np.float32), "float32")
    pydist.all_reduce(x)
    if rank == 1:
        os._exit(0)
    watchdog = engine_of(pydist.group.WORLD).watchdog
    deadline = time.monotonic() + 60
    while watchdog.failure is None and time.monotonic() < deadline:
        time.sleep(0.01)
    seen = f"{type(watchdog.failure).__name__}: {watchdog.failure}"
    with pytest.raises(pydist.DistError) as raised:
        pydist.all_reduce(up(rank, np.ones(4, np.float32), "float32"))
    return seen, str(raised.value)


def test_the_watchdog_names_a_peer_that_died_after_the_call_returned():
    with Pool(2, ENV, timeout=60) as pool:
        for rank in range(2):
            pool.send(rank, watchdog_case, "")
        ((seen, next_call),) = pool.collect([0], timeout=90)
    assert seen.startswith("PeerFailedError") and "rank 1" in seen and "exited" in seen, seen
    assert "rank 1" in next_call, next_call


def buffers_case(rank, size):
    x = up(rank, np.ones(3000, np.float32), "float32")
    pydist.all_reduce(x)
    pydist.send(x, dst=(rank + 1) % size) if rank == 0 else pydist.recv(x, src=0)
    down(rank, x)
    pydist.barrier()
    return os.getpid()


def test_device_buffers_are_released_at_destroy():
    pool = Pool(2, ENV, timeout=60)
    try:
        pids = pool.run(buffers_case)
    finally:
        pool.close()
    left = [name for name in os.listdir("/dev/shm") if name.startswith("pydist-d")
            and int(name.rsplit("-", 1)[1]) in pids]
    assert left == []


def poison_case(rank, size):
    """A reader that does not wait for the writer's event: the stand-in shows poison."""
    dev = device(rank)
    x = up(rank, np.ones(4, np.float32), "float32")
    return bool(is_poison(dev.to_host(x, dev.new_stream(), Deadline.after(60)).view(np.uint32), "float32").all())


def test_the_stand_in_is_strict_in_the_pool(pool):
    assert all(pool.run(poison_case))
