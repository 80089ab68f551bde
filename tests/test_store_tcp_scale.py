"""One TCPStore server under 1000 concurrent clients (one event loop thread serves them all)."""
from __future__ import annotations

import resource
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from pydist.store import TCPStore

CLIENTS = 1000
THREADS = 50


@pytest.fixture
def enough_file_descriptors():
    """Each client costs two descriptors in this process (its socket and the server's)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * CLIENTS + 256
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below {wanted}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.slow
def test_a_thousand_concurrent_clients(enough_file_descriptors):
    timeout = timedelta(seconds=30)
    with TCPStore("127.0.0.1", 0, is_master=True, timeout=timeout) as master:
        chunks = [range(t, CLIENTS, THREADS) for t in range(THREADS)]
        clients: dict[int, TCPStore] = {}
        lock = threading.Lock()

        def connect(ids: range) -> None:
            for i in ids:
                client = TCPStore("127.0.0.1", master.port, timeout=timeout)
                with lock:
                    clients[i] = client

        def work(ids: range) -> list[tuple[int, bytes, int]]:
            out = []
            for i in ids:
                client = clients[i]
                client.set(f"key/{i}", str(i))
                total = client.add("counter", 1)
                client.add(f"per-thread/{ids.start}", i)
                # a blocking get on another client's key: parked server-side until it is set
                out.append((i, client.get(f"key/{(i + 1) % CLIENTS}"), total))
            return out

        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(connect, chunks))
            assert len(clients) == CLIENTS
            assert len(master._server._peers) == CLIENTS + 1  # all connected at once
            results = [r for chunk in pool.map(work, chunks) for r in chunk]
            try:
                assert len(results) == CLIENTS
                assert all(value == str((i + 1) % CLIENTS).encode() for i, value, _ in results)
                assert sorted(total for _, _, total in results) == list(range(1, CLIENTS + 1))
                assert master.get("counter") == str(CLIENTS).encode()
                for ids in chunks:
                    assert int(master.get(f"per-thread/{ids.start}")) == sum(ids)
                assert master.num_keys() == CLIENTS + 1 + THREADS
            finally:
                list(pool.map(lambda client: client.close(), clients.values()))
