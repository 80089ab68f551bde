"""pydist-bench --scale: the hooks it reads (store server counts, init marks), its pieces,
and real runs at 4 and 8 ranks. Values are checked to be measured (present, nonzero,
consistent), never timed against a bound (benchmarks are a CLI, never asserts)."""
import time
from datetime import timedelta

import pydist as dist
from pydist.core import init_marks
from pydist.store import TCPStore
from pydist.testing import free_port

TIMEOUT = timedelta(seconds=30)


# -- the hooks ---------------------------------------------------------------------------------------
def _settled(master: TCPStore, connections: int) -> dict:
    """The server's counts once it has seen connections close down to ``connections`` (it
    learns of a close on its own thread), or after 10 s."""
    deadline = time.monotonic() + 10
    while (stats := master.server_stats())["connections"] > connections and time.monotonic() < deadline:
        time.sleep(0.01)
    return stats


def test_store_server_counts_requests_by_name_and_connections():
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT) as master:
        before = master.server_stats()
        with TCPStore("127.0.0.1", master.port, timeout=TIMEOUT) as client:
            client.set("a", b"1")
            client.add("n", 2)
            client.wait(["a"])
            assert client.get("a") == b"1"
            assert client.server_stats() is None  # a client only: no server here
            during = master.server_stats()
        after = _settled(master, during["connections"] - 1)
    assert before is not None and during is not None and after is not None
    added = {name: during["requests"].get(name, 0) - before["requests"].get(name, 0) for name in during["requests"]}
    assert added["set"] == 1 and added["add"] == 1 and added["wait"] == 1 and added["multi_get"] == 1
    assert during["connections"] == before["connections"] + 1
    assert during["peak_connections"] >= 2 and during["opened"] == before["opened"] + 1
    assert after["connections"] == before["connections"] and after["peak_connections"] == during["peak_connections"]


def test_init_marks_every_step_in_order():
    dist.init_process_group("pydist", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=TIMEOUT)
    try:
        marks = init_marks.marks()
    finally:
        dist.destroy_process_group()
    assert list(marks) == list(init_marks.STEPS)
    times = [marks[step] for step in init_marks.STEPS]
    assert times == sorted(times) and times[-1] > times[0]


def test_a_new_init_starts_the_marks_over():
    init_marks.mark(init_marks.INIT_DONE)
    init_marks.mark(init_marks.INIT_START)
    assert list(init_marks.marks()) == [init_marks.INIT_START]
