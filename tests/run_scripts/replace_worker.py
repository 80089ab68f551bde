"""A worker under ``pydist-run --on-failure replace``: steps of admit_joiners + an all_reduce
of ones until STEPS are done and (WAIT_FULL=1) the world is back to its size at start. The worker
launched as rank KILL_RANK kills itself (SIGKILL) at step KILL_STEP; the others shrink past
it and admit its replacement, which joins at their step. Every worker prints
``RESULT {json}``: whether it joined, its steps' (world size, sum), the world size after each
shrink, its last rank."""
import json
import os
import signal
import sys
import time

import numpy as np

import pydist as dist

STEPS, KILL_RANK, KILL_STEP, WAIT_FULL = (int(a) for a in sys.argv[1:5])


def step(number: int, admit: bool = True) -> list:
    if admit and dist.admit_joiners():
        dist.broadcast(np.array([number], np.int64), src=0)
    ones = np.ones(8)
    dist.all_reduce(ones)
    return [dist.get_world_size(), float(ones[0])]


def main() -> None:
    joined = os.environ.get("PYDIST_JOIN") == "1"
    full = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("pydist")
    done, shrunk_to, number = [], [], 0
    if joined:  # admitted inside the members' admit_joiners of their current step
        counter = np.zeros(1, np.int64)
        dist.broadcast(counter, src=0)
        number = int(counter[0])
        done.append(step(number, admit=False))
        number += 1
    while number < STEPS or (WAIT_FULL and dist.get_world_size() < full):
        if not joined and int(os.environ["RANK"]) == KILL_RANK and number == KILL_STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            done.append(step(number))
            number += 1
        except dist.DistError as error:
            dist.shrink_group(sorted(error.dead_ranks))
            shrunk_to.append(dist.get_world_size())
        if WAIT_FULL and dist.get_world_size() < full:
            time.sleep(0.01)  # a smaller world waits for the replacement: not too many steps meanwhile
    print("RESULT " + json.dumps({"joined": joined, "steps": done, "shrunk_to": shrunk_to,
                                       "rank": dist.get_rank()}), flush=True)
    dist.destroy_process_group()


main()
