"""pydist as a torch.distributed backend: registration, every call through torch's API,
torch's DistributedDataParallel over pydist equal to single-process training."""
import re
import sys
from datetime import timedelta

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as tdist  # noqa: E402

from pydist.testing import run_processes  # noqa: E402
from pydist.testing.commands import run_command  # noqa: E402


@pytest.mark.slow
def test_import_torch_registers_the_backend():
    """The torch.backends entry point: no `import pydist` needed."""
    code = "import torch, torch.distributed as d; print('PYDIST' in d.Backend._plugins, d.Backend('pydist'))"
    out = run_command([sys.executable, "-c", code], timeout=120)
    assert out.stdout.split() == ["True", "pydist"], out.stderr


def _every_call(rank, size):
    out = {}
    t = torch.arange(4, dtype=torch.float32) + rank
    tdist.all_reduce(t)
    out["all_reduce"] = t.tolist()
    t = torch.tensor([rank + 1.0])
    tdist.all_reduce(t, op=tdist.ReduceOp.PRODUCT)
    out["product"] = t.item()
    t = torch.tensor([float(rank)])
    if hasattr(tdist.ReduceOp, "factor"):  # torch 2.13 on: a Python backend can read PREMUL_SUM's factor
        tdist.all_reduce(t, op=tdist._make_nccl_premul_sum(2.0))
        out["premul"] = t.item()
    else:  # refused at the call, naming the torch
        with pytest.raises(RuntimeError, match=re.escape(f"PREMUL_SUM: this torch ({torch.__version__}) does not")):
            tdist.all_reduce(t, op=tdist._make_nccl_premul_sum(2.0))
        out["premul"] = 2.0 * sum(range(size))
    t = torch.full((3,), float(rank), dtype=torch.bfloat16)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    out["bf16_max"] = t.float().tolist()
    t = torch.full((2,), float(rank))
    tdist.broadcast(t, src=size - 1)
    out["broadcast"] = t.tolist()
    t = torch.full((2,), float(rank + 1))
    tdist.reduce(t, dst=0)
    out["reduce"] = t.tolist() if rank == 0 else None
    gathered = [torch.zeros(2) for _ in range(size)]
    tdist.all_gather(gathered, torch.full((2,), float(rank)))
    out["all_gather"] = [g.tolist() for g in gathered]
    flat = torch.zeros(2 * size)
    tdist.all_gather_into_tensor(flat, torch.full((2,), float(rank)))
    out["all_gather_into_tensor"] = flat.tolist()
    piece = torch.zeros(2)
    tdist.reduce_scatter_tensor(piece, torch.arange(2.0 * size))
    out["reduce_scatter_tensor"] = piece.tolist()
    piece = torch.zeros(1)
    tdist.reduce_scatter(piece, [torch.tensor([float(j)]) for j in range(size)])
    out["reduce_scatter"] = piece.tolist()
    received = torch.zeros(size)
    tdist.all_to_all_single(received, torch.arange(size, dtype=torch.float32) + 10 * rank)
    out["all_to_all_single"] = received.tolist()
    outs = [torch.zeros(1) for _ in range(size)]
    tdist.all_to_all(outs, [torch.tensor([float(rank * size + j)]) for j in range(size)])
    out["all_to_all"] = [o.item() for o in outs]
    slots = [torch.zeros(1) for _ in range(size)] if rank == 0 else None
    tdist.gather(torch.tensor([float(rank)]), slots, dst=0)
    out["gather"] = [s.item() for s in slots] if rank == 0 else None
    if hasattr(tdist, "gather_single"):  # torch 2.14's gather into one tensor
        into = torch.zeros(size, 2) if rank == 1 else None
        tdist.gather_single(torch.full((2,), float(rank)), into, dst=1)
        out["gather_single"] = into.tolist() if rank == 1 else None
        before = tdist.group.WORLD.pydist_group.timeout
        tdist.set_timeout(timedelta(seconds=50))  # torch 2.14's: the group's later operations on pydist
        out["timeout"] = tdist.group.WORLD.pydist_group.timeout
        tdist.set_timeout(timedelta(seconds=before))
        out["impl"] = tdist.get_backend_impl() is tdist.group.WORLD  # the plugin's group is its CPU backend
    mine = torch.zeros(1)
    tdist.scatter(mine, [torch.tensor([j * 3.0]) for j in range(size)] if rank == 0 else None, src=0)
    out["scatter"] = mine.item()
    empty = torch.zeros(0)
    tdist.all_reduce(empty)
    work = tdist.all_reduce(torch.ones(3), async_op=True)
    out["future"] = work.get_future().wait()[0].tolist()
    tdist.barrier()
    if rank == 0:  # a tag of its own: the any-source receive must not catch rank 2's batch send below
        tdist.send(torch.tensor([7.0]), dst=1, tag=5)
        got = torch.zeros(1)
        out["recv_any"] = (tdist.recv(got, tag=5), got.item())
    elif rank == 1:
        got = torch.zeros(1)
        tdist.recv(got, src=0, tag=5)
        out["recv"] = got.item()
        tdist.send(torch.tensor([9.0]), dst=0, tag=5)
    recv_buf = torch.zeros(1)
    ops = [tdist.P2POp(tdist.irecv, recv_buf, (rank - 1) % size),
           tdist.P2POp(tdist.isend, torch.tensor([float(rank)]), (rank + 1) % size)]
    for request in tdist.batch_isend_irecv(ops):
        request.wait()
    out["batch"] = recv_buf.item()
    objects = [None] * size
    tdist.all_gather_object(objects, {"rank": rank})
    out["objects"] = objects
    pair = tdist.new_group([0, 1])
    if rank < 2:
        t = torch.ones(2) * (rank + 1)
        tdist.all_reduce(t, group=pair)
        out["subgroup"] = t.tolist()
    out["backend"] = str(tdist.get_backend())
    with pytest.raises(ValueError, match="CPU tensors"):
        tdist.all_reduce(torch.empty(2, device="meta"))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 3])
def test_every_torch_call_runs_on_pydist(size):
    results = run_processes(size, _every_call, init="torch", timeout=180)
    for rank, out in enumerate(results):
        assert out["all_reduce"] == [sum(range(size)) + i * size for i in range(4)]
        assert out["product"] == float(np.prod(range(1, size + 1)))
        assert out["premul"] == 2.0 * sum(range(size))
        assert out["bf16_max"] == [float(size - 1)] * 3
        assert out["broadcast"] == [float(size - 1)] * 2
        assert out["reduce"] == ([float(sum(range(1, size + 1)))] * 2 if rank == 0 else None)
        assert out["all_gather"] == [[float(r)] * 2 for r in range(size)]
        assert out["all_gather_into_tensor"] == [float(r) for r in range(size) for _ in range(2)]
        assert out["reduce_scatter_tensor"] == [float(size * (2 * rank + i)) for i in range(2)]
        assert out["reduce_scatter"] == [float(size * rank)]
        assert out["all_to_all_single"] == [float(rank + 10 * j) for j in range(size)]
        assert out["all_to_all"] == [float(j * size + rank) for j in range(size)]
        assert out["gather"] == ([float(r) for r in range(size)] if rank == 0 else None)
        if hasattr(tdist, "gather_single"):
            assert out["gather_single"] == ([[float(r)] * 2 for r in range(size)] if rank == 1 else None)
            assert out["timeout"] == 50.0 and out["impl"]
        assert out["scatter"] == rank * 3.0
        assert out["future"] == [float(size)] * 3
        assert out["batch"] == float((rank - 1) % size)
        assert out["objects"] == [{"rank": r} for r in range(size)]
        assert out["backend"] == "pydist"
    assert results[0]["recv_any"] == (1, 9.0) and results[1]["recv"] == 7.0
    assert results[0]["subgroup"] == results[1]["subgroup"] == [3.0, 3.0]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _batches(steps, rows):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(rows, 8, generator=generator), torch.randint(0, 3, (rows,), generator=generator))
            for _ in range(steps)]


def _train(model, batches, rank=0, size=1):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        per = len(x) // size
        loss = torch.nn.functional.cross_entropy(model(x[rank * per:(rank + 1) * per]), y[rank * per:(rank + 1) * per])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def _torch_ddp(rank, size, steps):
    ddp = torch.nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.0005)
    _train(ddp, _batches(steps, 6 * size), rank, size)
    return [p.detach().numpy().copy() for p in ddp.module.parameters()]


@pytest.mark.slow
@pytest.mark.parametrize("size", [2, 3])
def test_torch_ddp_over_pydist_equals_single_process_training(size):
    steps = 5
    reference = [p.detach().numpy() for p in _train(_model(), _batches(steps, 6 * size)).parameters()]
    for params in run_processes(size, _torch_ddp, steps, init="torch", timeout=180):
        for got, want in zip(params, reference):
            np.testing.assert_allclose(got, want, atol=1e-5)
