"""A torch.distributed worker on the pydist plugin under ``pydist-run --on-failure replace``:
torch DDP steps on pydist.torch.Elastic until STEPS are done and the world is back to its size
at start. The worker launched as rank KILL_RANK kills itself (SIGKILL) at step KILL_STEP; the
others shrink past it, admit its replacement (joined in its init_process_group) and heal it.
Every worker prints ``RESULT {json}``: whether it joined, the world size of each step, its
last rank, a checksum of its parameters, and the sum of a torch new_group's all_reduce."""
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as tdist

import pydist.torch

STEPS, KILL_RANK, KILL_STEP = (int(a) for a in sys.argv[1:4])


def main() -> None:
    joined = os.environ.get("PYDIST_JOIN") == "1"
    full = int(os.environ["WORLD_SIZE"])
    tdist.init_process_group("pydist")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    job = pydist.torch.Elastic({"model": model, "optimizer": optimizer}, progress={"step": 0})
    sizes, ddp = [], None
    while job.progress["step"] < STEPS or tdist.get_world_size() < full:
        if job.sync() or ddp is None:
            ddp = torch.nn.parallel.DistributedDataParallel(model)
        step = job.progress["step"]
        if not joined and int(os.environ["RANK"]) == KILL_RANK and step == KILL_STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            optimizer.zero_grad()
            inputs = torch.full((2, 8), 0.1 * (step % 7 + tdist.get_rank()))  # differs per rank: DDP must average
            ddp(inputs).square().sum().backward()
            optimizer.step()
            job.progress["step"] += 1
            sizes.append(tdist.get_world_size())
        except Exception as error:  # noqa: BLE001 - torch DDP re-raises pydist's errors as RuntimeError
            job.recover(error)
        if tdist.get_world_size() < full:
            time.sleep(0.01)  # a smaller world waits for the replacement: not too many steps meanwhile
    checksum = float(sum(p.double().sum() for p in model.parameters()))
    one = torch.ones(1)
    tdist.all_reduce(one, group=tdist.new_group(list(range(tdist.get_world_size()))))
    result = {"joined": joined, "sizes": sizes, "rank": tdist.get_rank(), "step": job.progress["step"],
              "checksum": checksum, "new_group_sum": one.item()}
    print("RESULT " + json.dumps(result), flush=True)
    tdist.destroy_process_group()


main()
