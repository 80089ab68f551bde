"""train.py --fault-tolerant: training that loses workers, and takes their replacements in.

    pydist-run --nproc-per-node 4 --on-failure replace -m pydist.examples.train --fault-tolerant \\
               [--kill-rank 2 --kill-step 60]

Every step takes the same global batch, whatever the number of ranks: step k of an epoch is
images perm[k*G:(k+1)*G] of the epoch's shuffle (G = --batch-size x the job's size at start),
split into as many near-equal parts as there are ranks; each rank's loss is its part's sum
scaled by ranks / G, so DDP's average is the global batch's mean loss. The loop runs on
``pydist.Elastic``: when a step raises (a rank died or froze), the survivors shrink, take rank
0's model, optimizer and step if theirs differ, and do the step again; at each step's start
they admit the replacements ``pydist-run --on-failure replace`` starts and heal them from live
peers (with ``--on-failure continue`` the job goes on smaller). DDP is rebuilt whenever the
world changes. ``--kill-rank R --kill-step S`` makes the worker launched as rank R kill itself
(SIGKILL) at global step S, for the demonstration; killing or stopping any worker from
outside works the same (pydist.examples.chaos does it every 15 s). ``--report-events`` prints one
``EVENT {json}`` line per start, recovery and first step after a change, for pydist.examples.chaos.
"""
from __future__ import annotations

import json
import os
import signal
import time


def _process_start() -> float:
    """When this process started (Linux: /proc; elsewhere: now), so that its imports count."""
    try:
        with open("/proc/self/stat") as stat:
            since_boot = int(stat.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - since_boot)
    except (OSError, ValueError, AttributeError):
        return time.time()


STARTED = _process_start()  # a replacement's start counts its imports (train.py's torch and sklearn)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import pydist  # noqa: E402
from pydist.core.settings import settings  # noqa: E402
from pydist.data import DistributedSampler  # noqa: E402

IMPORTED = time.time()


def _event(args, **fields) -> None:
    if args.report_events:
        print("EVENT " + json.dumps({"pid": os.getpid(), "t": time.time(), **fields}), flush=True)


def run(args, train, held_out, make_model, accuracy) -> None:
    # What takes time comes before init_process_group, where a replacement (PYDIST_JOIN=1)
    # joins the running job: once admitted, the others wait for it at every collective.
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    pydist.init_process_group("pydist")
    launch_rank = int(os.environ.get("RANK", pydist.get_rank()))
    joined = settings().join  # PYDIST_JOIN=1: pydist-run started this process to replace one
    _event(args, event="hello", launch_rank=launch_rank, joined=joined, started=STARTED,
           imported=IMPORTED)
    global_batch = args.batch_size * int(os.environ.get("WORLD_SIZE", pydist.get_world_size()))
    job = pydist.Elastic({"model": model, "optimizer": optimizer}, progress={"step": 0})
    shuffle = DistributedSampler(train, num_replicas=1, rank=0, shuffle=True, seed=0)  # the global order
    x_all, y_all = train.tensors
    steps_per_epoch = -(-len(train) // global_batch)
    ddp, after, members, recovered = None, None, [], None  # recovered: (when, error, step) of a recover
    while job.progress["step"] < args.epochs * steps_per_epoch:
        step = job.progress["step"]
        try:
            began = time.perf_counter()
            if job.sync() or ddp is None:  # admitted and healed replacements (a replacement is
                ddp = pydist.DistributedDataParallel(model)  # healed here), or recovered from a loss
                since, error, failed_step = recovered or (began, None, step)
                members = _world_changed(args, job, members, failed_step, since, error)
                after, recovered = after or "sync", None
            epoch, k = divmod(step, steps_per_epoch)
            shuffle.set_epoch(epoch)
            order = np.fromiter(iter(shuffle), dtype=np.int64)
            ranks = pydist.get_world_size()
            part = np.array_split(order[k * global_batch:(k + 1) * global_batch], ranks)[pydist.get_rank()]
            if launch_rank == args.kill_rank and step == args.kill_step and not joined:
                os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            logits = ddp(x_all[part])
            loss = torch.nn.functional.cross_entropy(logits, y_all[part], reduction="sum") * ranks / global_batch
            loss.backward()
            optimizer.step()
            job.progress["step"] += 1
            if after is not None:
                _event(args, event="step", after=after, world=ranks, step=job.progress["step"])
                after = None
            if job.progress["step"] % steps_per_epoch == 0:
                _epoch_end(job.progress["step"] // steps_per_epoch, args.epochs, model, held_out, accuracy)
            if args.step_seconds:
                time.sleep(args.step_seconds)  # stands for a heavier model's compute
        except pydist.EvictedError as error:  # the others declared this rank dead (it was stopped)
            _event(args, event="evicted")
            raise SystemExit(f"launch rank {launch_rank}: {error}") from error
        except pydist.DistError as error:
            recovered = (time.perf_counter(), error, step)
            job.recover(error)  # no collective until the next sync(), which reports the change: every
            after = "recover"  # survivor, whether it recovered here or inside sync(), runs the same ones
    if pydist.get_rank() == 0:
        survivors = _launch_ranks()
        print(f"finished on {len(survivors)} ranks (launch ranks {survivors}): held-out accuracy "
              f"{accuracy(model, held_out) * 100:.1f} %", flush=True)
    else:
        _launch_ranks()
    pydist.destroy_process_group()


def _launch_ranks() -> list[int]:
    """Every rank's launch rank (RANK), in rank order (a replacement has the one it replaced)."""
    ranks = [None] * pydist.get_world_size()
    pydist.all_gather_object(ranks, int(os.environ.get("RANK", -1)))
    return ranks  # type: ignore[return-value]


def _epoch_end(epoch: int, epochs: int, model, held_out, accuracy) -> None:
    if pydist.get_rank() == 0:
        print(f"epoch {epoch:2d}/{epochs}  held-out accuracy {accuracy(model, held_out) * 100:.1f} %  "
              f"({pydist.get_world_size()} ranks)", flush=True)


def _world_changed(args, job: pydist.Elastic, members: list[int], step: int, began: float,
                   error: BaseException | None = None) -> list[int]:
    """The launch ranks of the new world; rank 0 reports who was lost (recovered from: ``error``,
    or inside ``job.sync()``) and who came back."""
    now = _launch_ranks()
    lost, back = [m for m in members if m not in now], [m for m in now if m not in members]
    if lost:
        _event(args, event="recovered", world=len(now), step=job.progress["step"], failed_step=step)
    if pydist.get_rank() == 0 and members and (lost or back):
        took = f"{(time.perf_counter() - began) * 1e3:.0f} ms"
        what = (f"lost launch rank(s) {lost} at step {step} ({type(error).__name__ if error else 'in sync'}); "
                f"recovered in {took}" if lost else f"took replacement(s) for launch rank(s) {back} in {took}")
        print(f"{what} on {len(now)} ranks {now}, same global batch", flush=True)
    return now
