"""A tour of pydist on N ranks: point-to-point and every collective, printing what each rank got.

Run it with the launcher:  pydist-run --nproc-per-node 4 -m pydist.examples.collectives
"""
import numpy as np

import pydist as dist


def show(rank: int, what: str, value) -> None:
    text = value.tolist() if isinstance(value, np.ndarray) else value
    print(f"rank {rank}: {what:<22} {text}", flush=True)


def main() -> None:
    dist.init_process_group("pydist")
    rank, size = dist.get_rank(), dist.get_world_size()
    mine = np.arange(2, dtype=np.int64) + 1 + 2 * rank  # rank r holds [2r+1, 2r+2]: [1,2], [3,4], ...
    show(rank, "input", mine)

    token = np.zeros(1)  # ping-pong around the ring
    if rank == 0:
        token += 1
        dist.send(token, dst=1 % size)
        dist.recv(token, src=size - 1)
    else:
        dist.recv(token, src=rank - 1)
        token += 1
        dist.send(token, dst=(rank + 1) % size)
    show(rank, "send/recv ring token", token)

    t = mine.copy()
    dist.broadcast(t, src=0)
    show(rank, "broadcast from 0", t)

    out = np.zeros(2, np.int64)
    dist.scatter(out, [np.full(2, i, np.int64) for i in range(size)] if rank == 0 else None, src=0)
    show(rank, "scatter from 0", out)

    gathered = [np.zeros(2, np.int64) for _ in range(size)] if rank == 0 else None
    dist.gather(mine, gathered, dst=0)
    if rank == 0:
        show(rank, "gather to 0", np.stack(gathered))

    t = mine.copy()
    dist.reduce(t, dst=size - 1, op=dist.ReduceOp.SUM)
    if rank == size - 1:
        show(rank, f"reduce SUM to {size - 1}", t)

    everyone = [np.zeros(2, np.int64) for _ in range(size)]
    dist.all_gather(everyone, mine)
    show(rank, "all_gather", np.stack(everyone))

    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.PRODUCT):
        t = mine.copy()
        dist.all_reduce(t, op=op)
        show(rank, f"all_reduce {op.name}", t)
    t = mine.astype(np.float32)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    show(rank, "all_reduce AVG", t)

    piece = np.zeros(2, np.int64)
    dist.reduce_scatter_tensor(piece, np.tile(mine, size))
    show(rank, "reduce_scatter", piece)

    received = np.zeros(size, np.int64)
    dist.all_to_all_single(received, np.arange(size, dtype=np.int64) + 10 * rank)
    show(rank, "all_to_all_single", received)

    pair = dist.new_group([0, 1]) if size > 1 else None
    if pair is not None and rank in (0, 1):
        t = np.array([1.0, 2.0, 3.0]) if rank == 0 else np.array([4.0, 5.0, 6.0])
        dist.all_reduce(t, group=pair)
        show(rank, "all_reduce on [0, 1]", t)

    objects = [None] * size
    dist.all_gather_object(objects, {"rank": rank, "hello": "world"[: rank + 1]})
    show(rank, "all_gather_object", objects)

    work = dist.all_reduce(np.ones(1000, np.float64), async_op=True)
    work.wait()
    dist.barrier()
    show(rank, "async all_reduce", f"completed={work.is_completed()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
