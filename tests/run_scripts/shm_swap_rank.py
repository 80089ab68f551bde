"""A rank of a 2-rank job whose new group's shared memory an outsider swaps through the store
(tests/test_adversarial_launches.py).

``shm_swap_rank.py API SIGNALS``: API "torch" (torch.distributed on backend "pydist") or
"pydist"; started by any launcher (torchrun, mpiexec, by hand with env://). Rank 0 writes
``SIGNALS/store`` (the job's store, "host port": what any local user sees in ``ss -ltn``).
Both make ``new_group([0, 1])``: rank 0 creates its segments and publishes their names in
the store; rank 1, once the first name is there and before it reads it, writes
``SIGNALS/published`` (that name's store key, relative to the group's store) and waits for
``SIGNALS/go``, the attacker's signal that the name was swapped. This gate only takes away
the race that an attacker polling the store has to win (issue 46's pass won it at startup);
what rank 1 then reads and checks is untouched. Then both all_reduce on the group. With
SWAP_AT=init, rank 1 gates the first name of ``init_process_group`` instead (the host's
ring segment, or the default group's arena). Each rank writes ``SIGNALS/rank<r>.json``:
``{"result": [the distinct values]}`` or ``{"error": "Type: message", "seconds": the time
from the start of the gated step to the error}``.
"""
import faulthandler
import json
import os
import sys
import time
from datetime import timedelta


def main(api: str, signals: str) -> None:
    if api == "torch":
        import torch
        import torch.distributed as dist

        import pydist.torch  # noqa: F401 - registers the backend
        data = torch.full((4096,), 0.0)
    else:
        import numpy as np

        import pydist as dist
        data = np.zeros(4096)
    from pydist.rendezvous.launch_env import launch_info

    timeout = timedelta(seconds=float(os.environ.get("SWAP_TIMEOUT", "20")))
    at_init = os.environ.get("SWAP_AT", "new_group") == "init"
    faulthandler.dump_traceback_later(4 * timeout.total_seconds(), exit=True)  # a hung rank says where
    info = launch_info()
    rank = info.rank
    outcome: dict = {}
    if rank == 0:
        _write(signals, "store", f"{info.master_addr} {info.master_port}")
    started = time.monotonic()
    try:
        if at_init and rank == 1:
            _gate_the_first_name(signals)
        dist.init_process_group("pydist", timeout=timeout)
        if not at_init:
            if rank == 1:
                _gate_the_first_name(signals)
            started = time.monotonic()
        group = dist.new_group([0, 1], timeout=timeout)
        data += rank + 1
        dist.all_reduce(data, group=group)
        outcome["result"] = sorted(set(data.tolist()))
    except Exception as error:  # noqa: BLE001 - reported to the test
        outcome["error"] = f"{type(error).__name__}: {error}"
        outcome["seconds"] = time.monotonic() - started
    _write(signals, f"rank{rank}.json", json.dumps(outcome))
    os._exit(0)  # the group may be broken: no clean shutdown to wait for


def _gate_the_first_name(signals: str) -> None:
    """Rank 1: the next segment name it waits for, once it is in the store, is read only
    after ``SIGNALS/go`` (see the module)."""
    from pydist.transport.shm import sharing

    wait_for_name = sharing._wait_for_name

    def gated(store, key, *args, **kwargs):
        wait_for_name(store, key, *args, **kwargs)
        sharing._wait_for_name = wait_for_name  # once
        _write(signals, "published", key)
        _wait_for(f"{signals}/go")

    sharing._wait_for_name = gated


def _write(signals: str, name: str, text: str) -> None:
    with open(f"{signals}/{name}.tmp", "w") as file:
        file.write(text)
    os.replace(f"{signals}/{name}.tmp", f"{signals}/{name}")


def _wait_for(path: str, seconds: float = 120.0) -> None:
    ends = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > ends:
            raise TimeoutError(f"{path} never came")
        time.sleep(0.02)  # a file from another process: nothing to wait on but the file system


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
