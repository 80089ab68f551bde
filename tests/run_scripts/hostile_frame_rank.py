"""A rank for tests/test_adversarial_frames.py: rank 1 is an authenticated peer that sends
rank 0 one malformed 48-byte header; rank 0 waits for a message from it and reports what it
raised, when, and how much its memory grew. JSON lines on stdout.

``ATTACK``: ``beat`` (a BEAT claiming 2 GiB) or ``data`` (a DATA frame claiming 128 TiB for
a receive nobody posted). ``CARRIER``: ``tcp`` (the bytes go on rank 1's established,
authenticated connection to rank 0) or ``ring`` (into rank 1's shared-memory ring to rank 0).
Rank 1 sends once it reads a line on stdin, then stays alive until killed: whatever rank 0
raises comes from the frame, not from rank 1 leaving."""
import json
import os
import sys
import time
from datetime import timedelta

import numpy as np

import pydist as dist
from pydist.groups import world as _world
from pydist.transport.framing import Kind, encode_header

HEADERS = {"beat": encode_header(Kind.BEAT, 0, 0, 0, 2 << 30),
           "data": encode_header(Kind.DATA, 0xFEED, 1, 0, 1 << 47)}


def status(field: str) -> int:
    """A /proc/self/status figure in bytes (VmRSS: resident now; VmHWM: the peak)."""
    with open("/proc/self/status") as lines:
        for line in lines:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


def report(**fields) -> None:
    print(json.dumps({"rank": dist.get_rank(), "pid": os.getpid(), **fields}), flush=True)


def main() -> None:
    attack, carrier = sys.argv[1], sys.argv[2]
    dist.init_process_group("pydist", timeout=timedelta(seconds=45))
    dist.barrier()  # every connection (and ring) is up and authenticated
    transport = _world.current().transport
    if dist.get_rank() == 1:
        report(ready=time.time())
        sys.stdin.readline()
        raw = memoryview(HEADERS[attack])
        if carrier == "ring":
            transport.host_local._send(0, [raw], None)
        else:
            transport.network.lanes(0)[0].send([raw], None)
        report(sent=time.time())
        sys.stdin.readline()  # alive until the harness is done
        os._exit(0)
    rss = status("VmRSS")
    report(ready=time.time(), rss=rss, hwm=status("VmHWM"), shm=transport.host_local is not None)
    try:
        dist.recv(np.empty(4, np.float32), src=1)
        outcome = {"type": "returned", "message": ""}
    except BaseException as error:  # noqa: BLE001 - the report says what it was (a bare MemoryError, say)
        outcome = {"type": type(error).__name__, "message": str(error),
                   "dead": sorted(getattr(error, "dead_ranks", ()))}
    report(raised=time.time(), rss_before=rss, rss_after=status("VmRSS"), hwm_after=status("VmHWM"), **outcome)
    os._exit(0)


if __name__ == "__main__":
    main()
