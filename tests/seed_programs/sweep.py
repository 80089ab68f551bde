"""The seeds' examples generalised to any world size, for ``pydist.testing.run_processes``.

``run_all(rank_id, size, lib)`` runs, on numpy arrays (lib="numpy") or torch tensors
(lib="torch"), seed 001's ping-pong as a ring (rank 0 sends 1, every rank adds 1 and
passes it on, rank 0 receives ``size``), then broadcast / scatter / gather / reduce
(dst = size - 1) / all_gather / all_reduce on ``arange(2) + 1 + 2 * rank_id`` with the
lists sized to the world, then seed 000's all_reduce on ``new_group([0, 1])`` (ranks
outside the group call it too: a no-op with a warning). It returns what each rank holds
afterwards, as plain lists. ``run_libs`` runs it once per library named, in that order,
in the same group.
"""
from __future__ import annotations

import warnings

import pydist as dist


class _Numpy:
    def __init__(self):
        import numpy as np
        self.np = np

    def zeros(self, n, int64=False):
        return self.np.zeros(n, dtype=self.np.int64 if int64 else self.np.float64)

    def arange2(self):
        return self.np.arange(2, dtype=self.np.int64)

    def tensor(self, values):
        return self.np.array(values)


class _Torch:
    def __init__(self):
        import torch
        self.torch = torch

    def zeros(self, n, int64=False):
        return self.torch.zeros(n, dtype=self.torch.int64) if int64 else self.torch.zeros(n)

    def arange2(self):
        return self.torch.arange(2, dtype=self.torch.int64)

    def tensor(self, values):
        return self.torch.tensor(values)


def _as_list(t):
    return t.tolist()


def run_all(rank_id, size, lib="numpy"):
    xp = _Torch() if lib == "torch" else _Numpy()
    kind = type(xp.zeros(1)).__name__
    out = {"kind": kind}

    if size > 1:  # seed 001's ping-pong, as a ring
        tensor = xp.zeros(1)
        if rank_id == 0:
            tensor += 1
            dist.send(tensor=tensor, dst=1)
            dist.recv(tensor=tensor, src=size - 1)
        else:
            dist.recv(tensor=tensor, src=rank_id - 1)
            tensor += 1
            dist.send(tensor=tensor, dst=(rank_id + 1) % size)
        out["ping_pong"] = _as_list(tensor)

    tensor = xp.arange2() + 1 + 2 * rank_id
    dist.broadcast(tensor, src=0)
    out["broadcast"] = _as_list(tensor)

    tensor = xp.arange2() + 1 + 2 * rank_id
    if rank_id == 0:
        scatter_list = [xp.tensor([i, i]) for i in range(size)]
        dist.scatter(tensor, src=0, scatter_list=scatter_list)
    else:
        dist.scatter(tensor, src=0)
    out["scatter"] = _as_list(tensor)

    tensor = xp.arange2() + 1 + 2 * rank_id
    if rank_id == 0:
        gather_list = [xp.zeros(2, int64=True) for _ in range(size)]
        dist.gather(tensor, dst=0, gather_list=gather_list)
        out["gather"] = [_as_list(t) for t in gather_list]
    else:
        dist.gather(tensor, dst=0)
    out["gather_input"] = _as_list(tensor)

    tensor = xp.arange2() + 1 + 2 * rank_id
    dist.reduce(tensor, dst=size - 1, op=dist.ReduceOp.SUM)
    if rank_id == size - 1:
        out["reduce"] = _as_list(tensor)

    tensor = xp.arange2() + 1 + 2 * rank_id
    gather_list = [xp.zeros(2, int64=True) for _ in range(size)]
    dist.all_gather(gather_list, tensor)
    out["all_gather"] = [_as_list(t) for t in gather_list]

    tensor = xp.arange2() + 1 + 2 * rank_id
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    out["all_reduce"] = _as_list(tensor)

    if size > 1:  # seed 000's all_reduce on new_group([0, 1]), called by every rank
        group = dist.new_group([0, 1])
        tensor = xp.tensor([1., 2., 3.]) if rank_id == 0 else xp.tensor([4., 5., 6.])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
        out["group_all_reduce"] = _as_list(tensor)
        out["group_warnings"] = [str(w.message) for w in caught]

    dist.barrier()
    return out


def run_libs(rank_id, size, libs):
    """``run_all`` on each library of ``libs`` in turn, in the one group: ``{lib: result}``."""
    return {lib: run_all(rank_id, size, lib) for lib in libs}
