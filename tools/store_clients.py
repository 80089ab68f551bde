"""The store under many clients: N TCPStore clients (spread over --procs processes, each
client its own connection) do init's rendezvous against one server, as N ranks would.

    python tools/store_clients.py --clients 1024 [--procs 8] [--record-bytes 300]

Each client publishes a record of --record-bytes (``set``), then reads what the transport
reads today: it waits for all N records and fetches them (``multi_get``: N^2 records through
the server in all). Reported: the time from the first set to the last client's fetch, the
requests by kind and per second, the server's peak connections, and its process's memory
(the server runs in this process).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from datetime import timedelta

from pydist.store import TCPStore


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
    return kb / 1024


def _clients(port: int, ranks: list[int], size: int, record: bytes, start, done) -> None:
    stores = [TCPStore("127.0.0.1", port, timeout=timedelta(seconds=600)) for _ in ranks]
    start.wait()
    for store, rank in zip(stores, ranks):
        store.set(f"tcp/{rank}", record)
    keys = [f"tcp/{r}" for r in range(size)]
    for store in stores:
        store.wait(keys)
        assert len(store.multi_get(keys)) == size
    done.put(time.time())
    for store in stores:
        store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1024)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--record-bytes", type=int, default=300)
    args = parser.parse_args()
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    base_rss = _rss_mib()
    context = multiprocessing.get_context("fork")
    start, done = context.Event(), context.Queue()
    share = [list(range(p, args.clients, args.procs)) for p in range(args.procs)]
    procs = [context.Process(target=_clients, args=(server.port, ranks, args.clients, b"x" * args.record_bytes,
                                                    start, done)) for ranks in share]
    for proc in procs:
        proc.start()
    while (server.server_stats() or {}).get("connections", 0) < args.clients:  # every client connected
        time.sleep(0.05)
    before = dict(server.server_stats()["requests"])
    began = time.time()
    start.set()
    ended = max(done.get() for _ in procs)
    stats = server.server_stats()
    requests = {k: v - before.get(k, 0) for k, v in stats["requests"].items() if v - before.get(k, 0)}
    total = sum(requests.values())
    print(f"{args.clients} clients in {args.procs} processes, {args.record_bytes} B records: rendezvous "
          f"{ended - began:.2f} s; {total} requests ({requests}), {total / (ended - began):.0f}/s; "
          f"server: peak {stats['peak_connections']} connections, memory {base_rss:.0f} -> {_rss_mib():.0f} MiB; "
          f"records through it: {args.clients ** 2 * args.record_bytes / 2**20:.0f} MiB")
    for proc in procs:
        proc.join()
    server.close()
    os._exit(0)


if __name__ == "__main__":
    main()
