"""A worker of tools/rejoin_trials.py (under pydist-run --on-failure replace): a training-like
loop on pydist.Elastic with STATE_MB of state, printing JSON events on stdout:

- ``hello``: pid, launch rank, whether it joined, when its Python started;
- ``step``: the first step finished after the world changed (its size, the time), after a
  recovery (``after: "recover"``) or an admission (``after: "sync"``);
- ``lost``: a rank lost was recovered from, in a step (``caught``: when the error came) or
  inside sync (``began``: when that sync began), for a look at where recovery time goes;
- ``wrong``: an all_reduce or a healed state that does not check out.

Every step: sync, an all_reduce of ones (its sum must be the world size), the weights moved by
1 on every rank alike (a healed rank's checksum must equal the members').
"""
import time

STARTED = time.time()  # before the imports: a replacement's start counts its imports

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402

import pydist as dist  # noqa: E402


def say(**fields) -> None:
    print(json.dumps({"pid": os.getpid(), "t": time.time(), **fields}), flush=True)


def main() -> None:
    state_mb, step_seconds = float(sys.argv[1]), float(sys.argv[2])
    dist.init_process_group("pydist")
    joined = os.environ.get("PYDIST_JOIN") == "1"
    say(event="hello", rank=int(os.environ["RANK"]), joined=joined, started=STARTED, world=dist.get_world_size())
    weights = np.zeros(int(state_mb * (1 << 20)) // 4, np.float32)
    job = dist.Elastic({"weights": weights}, progress={"step": 0})
    after = None
    size = dist.get_world_size()
    while True:
        try:
            began = time.time()
            if job.sync():
                after = after or "sync"
                if dist.get_world_size() < size:
                    say(event="lost", began=began, caught=None)
                check = np.array([weights[0], -weights[0], float(job.progress["step"]), -job.progress["step"]])
                dist.all_reduce(check, op=dist.ReduceOp.MAX)
                if check[0] != -check[1] or check[2] != -check[3]:
                    say(event="wrong", what="healed state differs", check=check.tolist())
            ones = np.ones(16, np.float32)
            dist.all_reduce(ones)
            if ones[0] != dist.get_world_size():
                say(event="wrong", what="all_reduce", got=float(ones[0]), world=dist.get_world_size())
            weights[::4096] += 1.0
            job.progress["step"] += 1
            if after is not None:
                say(event="step", after=after, world=dist.get_world_size(), step=job.progress["step"])
                after = None
            time.sleep(step_seconds)
        except dist.EvictedError:
            say(event="evicted")
            os._exit(3)
        except dist.DistError as error:
            caught = time.time()
            job.recover(error)
            after = "recover"
            say(event="lost", began=None, caught=caught)


if __name__ == "__main__":
    main()
