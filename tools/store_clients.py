"""The store under many clients: N TCPStore clients (spread over --procs processes, each
client its own connection) do init's rendezvous against one server, as N ranks would.

    python tools/store_clients.py --clients 1024 [--procs 8] [--record-bytes 300] [--directory]

Each client publishes a record of --record-bytes (``set``), then reads what the eager mesh
reads: it waits for all N records and fetches them (``multi_get``: N^2 records through the
server in all); with --directory, what lazy connections read (transport/tcp/mesh.py,
publish_and_meet): client 0 fetches the N records and publishes a directory (an index per
rank), which the others wait for and fetch. Reported: the time from the first set to the last client's fetch, the
requests by kind and per second, the server's peak connections, and its process's memory
(the server runs in this process).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from datetime import timedelta

from pydist.store import TCPStore


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
    return kb / 1024


def _clients(port: int, ranks: list[int], size: int, record: bytes, directory: bool, start, done) -> None:
    stores = [TCPStore("127.0.0.1", port, timeout=timedelta(seconds=600)) for _ in ranks]
    start.wait()
    for store, rank in zip(stores, ranks):
        store.set(f"tcp/{rank}", record)
    keys = [f"tcp/{r}" for r in range(size)]
    for store, rank in zip(stores, ranks):
        if directory and rank:
            store.wait(["tcp/directory"])
            store.multi_get(["tcp/directory"])
            continue
        store.wait(keys)
        assert len(store.multi_get(keys)) == size
        if directory:
            store.set("tcp/directory", json.dumps({"hosts": ["a-host"], "of": [0] * size}))
    done.put(time.time())
    for store in stores:
        store.close()


def _records_mib(args) -> float:
    """The records the clients fetch: each one's all of them, or (directory) client 0's."""
    fetching = 1 if args.directory else args.clients
    return fetching * args.clients * args.record_bytes / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=1024)
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--record-bytes", type=int, default=300)
    parser.add_argument("--directory", action="store_true", help="lazy connections' rendezvous")
    args = parser.parse_args()
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    base_rss = _rss_mib()
    context = multiprocessing.get_context("fork")
    start, done = context.Event(), context.Queue()
    share = [list(range(p, args.clients, args.procs)) for p in range(args.procs)]
    procs = [context.Process(target=_clients, args=(server.port, ranks, args.clients, b"x" * args.record_bytes,
                                                    args.directory, start, done)) for ranks in share]
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
    print(f"{args.clients} clients in {args.procs} processes, {args.record_bytes} B records, "
          f"{'directory' if args.directory else 'every record to every client'}: rendezvous "
          f"{ended - began:.2f} s; {total} requests ({requests}), {total / (ended - began):.0f}/s; "
          f"server: peak {stats['peak_connections']} connections, memory {base_rss:.0f} -> {_rss_mib():.0f} MiB; "
          f"records through it: {_records_mib(args):.1f} MiB")
    for proc in procs:
        proc.join()
    server.close()
    os._exit(0)


if __name__ == "__main__":
    main()
