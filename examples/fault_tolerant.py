"""train.py --fault-tolerant: training that loses a worker and goes on in the same processes.

    pydist-run --nproc-per-node 4 --on-failure continue examples/train.py --fault-tolerant \\
               [--kill-rank 2 --kill-step 60]

Every step takes the same global batch, whatever the number of ranks: step k of an epoch is
images perm[k*G:(k+1)*G] of the epoch's shuffle (G = --batch-size x the ranks at the start),
split into as many near-equal parts as there are ranks; each rank's loss is its part's sum
scaled by ranks / G, so DDP's average is the global batch's mean loss. When a collective
raises (a rank died), the survivors shrink the default group, rank 0 sends its model,
optimizer and position to the others (one of them may have finished the step the others
failed in), DDP is rebuilt on the new group, and the step is redone. ``--kill-rank R
--kill-step S`` makes the worker launched as rank R kill itself (SIGKILL) at global step S,
for the demonstration; killing any worker from outside works the same.
"""
from __future__ import annotations

import os
import signal
import time

import numpy as np
import torch

import pydist
from pydist.data import DistributedSampler


def run(args, train, held_out, make_model, accuracy) -> None:
    pydist.init_process_group("pydist")
    launch_rank = int(os.environ.get("RANK", pydist.get_rank()))
    members = list(range(pydist.get_world_size()))  # the launch rank of each rank
    global_batch = args.batch_size * len(members)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ddp = pydist.DistributedDataParallel(model)
    shuffle = DistributedSampler(train, num_replicas=1, rank=0, shuffle=True, seed=0)  # the global order
    x_all, y_all = train.tensors
    steps_per_epoch = -(-len(train) // global_batch)
    step = 0  # global step: epoch * steps_per_epoch + step in the epoch
    while step < args.epochs * steps_per_epoch:
        epoch, k = divmod(step, steps_per_epoch)
        shuffle.set_epoch(epoch)
        order = np.fromiter(iter(shuffle), dtype=np.int64)
        part = np.array_split(order[k * global_batch:(k + 1) * global_batch], len(members))[pydist.get_rank()]
        if launch_rank == args.kill_rank and step == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            optimizer.zero_grad()
            logits = ddp(x_all[part])
            loss = torch.nn.functional.cross_entropy(logits, y_all[part], reduction="sum") * len(members) / global_batch
            loss.backward()
            optimizer.step()
            step += 1
            if step % steps_per_epoch == 0:
                _epoch_end(step // steps_per_epoch, args.epochs, model, held_out, accuracy)
        except pydist.DistError as error:
            ddp, members, step = _recover(error, model, optimizer, members, step)
    if pydist.get_rank() == 0:
        print(f"finished on {len(members)} ranks (launch ranks {members}): held-out accuracy "
              f"{accuracy(model, held_out) * 100:.1f} %", flush=True)
    pydist.destroy_process_group()


def _epoch_end(epoch: int, epochs: int, model, held_out, accuracy) -> None:
    if pydist.get_rank() == 0:
        print(f"epoch {epoch:2d}/{epochs}  held-out accuracy {accuracy(model, held_out) * 100:.1f} %  "
              f"({pydist.get_world_size()} ranks)", flush=True)


def _recover(error: pydist.DistError, model, optimizer, members: list[int], step: int):
    """Shrink past the dead ranks, take rank 0's state and position, rebuild DDP."""
    began = time.perf_counter()
    dead = sorted(error.dead_ranks) or [error.rank]
    pydist.shrink_group(dead)
    survivors = [None] * pydist.get_world_size()
    pydist.all_gather_object(survivors, int(os.environ.get("RANK", -1)))  # launch ranks, in new rank order
    lost = [m for m in members if m not in survivors]
    state = [{"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}]
    pydist.broadcast_object_list(state, src=0)
    model.load_state_dict(state[0]["model"])
    optimizer.load_state_dict(state[0]["optimizer"])
    ddp = pydist.DistributedDataParallel(model)
    if pydist.get_rank() == 0:
        print(f"lost launch rank(s) {lost} at step {state[0]['step']} ({type(error).__name__}); recovered in "
              f"{(time.perf_counter() - began) * 1e3:.0f} ms on {len(survivors)} ranks {survivors}, "
              "same global batch", flush=True)
    return ddp, survivors, state[0]["step"]
