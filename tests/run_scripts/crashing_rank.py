"""Two ranks; rank 1 ends while rank 0 still needs it (tests/test_failure_exit_cause.py).

``crashing_rank.py MODE API [spawn]``: after one all_reduce, rank 1 ends as MODE says (raise:
ValueError; exit3: sys.exit(3); raise3: ``raise SystemExit(3)``; memory: a MemoryError;
sigkill, sigsegv: that signal's default action; clean: returns without
destroy_process_group; destroy: destroy_process_group, then returns); rank 0's second
all_reduce fails, and rank 0 prints what it raised as one JSON line ``{"rank0_error": ...}``.
API: "pydist" (``import pydist as dist``) or "torch" (torch.distributed on the plugin).
Under a launcher (pydist-run, torchrun) as is; with ``spawn`` the two ranks are started by
torch.multiprocessing.spawn, whose parent prints rank 0's line.
"""
import faulthandler
import json
import os
import signal
import sys
import tempfile

import numpy as np


def rank_main(mode: str, api: str, out: str | None = None) -> None:
    # A launcher stopping the job once rank 1 has ended must not cut rank 0's report short; set
    # before the first all_reduce, from which rank 1 may return (and end) before rank 0 does.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if api == "torch":
        import torch
        import torch.distributed as dist

        import pydist.torch  # noqa: F401 - registers the backend
        buffer = torch.ones(4)
    else:
        import pydist as dist
        buffer = np.ones(4, np.float32)
    dist.init_process_group("pydist")
    dist.all_reduce(buffer)
    if dist.get_rank() == 1:
        if mode == "raise":
            raise ValueError("rank one broke")
        if mode == "exit3":
            sys.exit(3)
        if mode == "raise3":
            raise SystemExit(3)
        if mode in ("sigkill", "sigsegv"):
            faulthandler.disable()  # the default action, whatever the environment asked for
            os.kill(os.getpid(), signal.SIGKILL if mode == "sigkill" else signal.SIGSEGV)
        if mode == "memory":
            np.empty(1 << 62, np.uint8)
        if mode == "destroy":
            dist.destroy_process_group()
        return
    try:
        dist.all_reduce(buffer)
        line = {"rank0_error": None}
    except Exception as error:  # noqa: BLE001 - what rank 0 raised is the result
        line = {"rank0_error": f"{type(error).__name__}: {error}"}
    if out is None:
        print(json.dumps(line), flush=True)
    else:
        with open(out, "w") as file:
            json.dump(line, file)


def _spawned(index: int, mode: str, api: str, port: int, out: str) -> None:
    os.environ.update(RANK=str(index), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      LOCAL_RANK=str(index))
    rank_main(mode, api, out)


def spawn(mode: str, api: str) -> None:
    import socket

    import torch.multiprocessing as mp
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "rank0.json")
        try:
            mp.spawn(_spawned, args=(mode, api, port, out), nprocs=2)
        except Exception as error:  # noqa: BLE001 - the parent reports what it raised
            print(f"spawn raised {type(error).__name__}", file=sys.stderr)
        with open(out) as file:
            print(file.read(), flush=True)


if __name__ == "__main__":
    if sys.argv[3:] == ["spawn"]:
        spawn(sys.argv[1], sys.argv[2])
    else:
        rank_main(sys.argv[1], sys.argv[2])
