"""CUDA tensors through torch.distributed beside pydist ("cpu:pydist,cuda:gloo", PYDIST_CUDA=gloo)
and on pydist's own CUDA engine ("cpu:pydist,cuda:pydist", PYDIST_CUDA_ENGINE=1): every call
gives the CPU result, point-to-point works (staged through host memory by pydist beside gloo,
whose own aborts the process; device to device on the engine), CPU tensors of the same group
stay on pydist, torch's DDP on a CUDA model trains as over gloo, and so does pydist's own DDP.
Every rank uses cuda:0 (one GPU is enough). Skipped without a GPU; `make gpu-check` runs them
on a GPU machine."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as tdist  # noqa: E402

from pydist.testing import run_processes  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available())")]

BESIDE_GLOO = "torch:cpu:pydist,cuda:gloo"
ENGINE = "torch:cpu:pydist,cuda:pydist"


def _cuda_calls(rank, size):
    dev = torch.device("cuda", 0)
    out = {}
    t = torch.arange(4, dtype=torch.float32, device=dev) + rank
    tdist.all_reduce(t)
    out["all_reduce"] = t.tolist()
    t = torch.full((2,), float(rank), device=dev)
    tdist.broadcast(t, src=size - 1)
    out["broadcast"] = t.tolist()
    gathered = [torch.zeros(2, device=dev) for _ in range(size)]
    tdist.all_gather(gathered, torch.full((2,), float(rank), device=dev))
    out["all_gather"] = [g.tolist() for g in gathered]
    flat = torch.zeros(2 * size, device=dev)
    tdist.all_gather_into_tensor(flat, torch.full((2,), float(rank), device=dev))
    out["all_gather_into_tensor"] = flat.tolist()
    piece = torch.zeros(2, device=dev)
    tdist.reduce_scatter_tensor(piece, torch.arange(2.0 * size, device=dev))
    out["reduce_scatter_tensor"] = piece.tolist()
    received = torch.zeros(size, device=dev)
    tdist.all_to_all_single(received, torch.arange(size, dtype=torch.float32, device=dev) + 10 * rank)
    out["all_to_all_single"] = received.tolist()
    work = tdist.all_reduce(torch.ones(3, device=dev), async_op=True)
    work.wait()
    got = torch.zeros(3, device=dev)
    ops = [tdist.P2POp(tdist.irecv, got, (rank - 1) % size),
           tdist.P2POp(tdist.isend, torch.full((3,), float(rank), device=dev), (rank + 1) % size)]
    for request in tdist.batch_isend_irecv(ops):
        request.wait()
    out["ring"] = got.tolist()
    if rank == 0:
        tdist.send(torch.tensor([7.0], device=dev), dst=1)
    elif rank == 1:
        got = torch.zeros(1, device=dev)
        tdist.recv(got, src=0)
        out["recv"] = got.tolist()
    cpu = torch.ones(2) * (rank + 1)
    tdist.all_reduce(cpu)  # the same group's CPU tensors: pydist
    out["cpu"] = cpu.tolist()
    objects = [None] * size
    tdist.all_gather_object(objects, {"rank": rank})
    out["objects"] = objects
    with pytest.raises(ValueError, match="tensors on cpu, cuda:0 in one call"):
        tdist.all_gather([torch.zeros(1) for _ in range(size)], torch.zeros(1, device=dev))
    tdist.barrier()
    return out


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("init,env", [(BESIDE_GLOO, {}), ("torch", {"PYDIST_CUDA": "gloo"}), (ENGINE, {}),
                                      ("torch", {"PYDIST_CUDA_ENGINE": "1"})],
                         ids=["cpu:pydist,cuda:gloo", "PYDIST_CUDA=gloo", "cpu:pydist,cuda:pydist",
                              "PYDIST_CUDA_ENGINE=1"])
def test_cuda_tensors_in_every_call_give_the_cpu_result(size, init, env):
    for rank, out in enumerate(run_processes(size, _cuda_calls, init=init, env=env, timeout=300)):
        assert out["all_reduce"] == [sum(range(size)) + i * size for i in range(4)]
        assert out["broadcast"] == [float(size - 1)] * 2
        assert out["all_gather"] == [[float(r)] * 2 for r in range(size)]
        assert out["all_gather_into_tensor"] == [float(r) for r in range(size) for _ in range(2)]
        assert out["reduce_scatter_tensor"] == [float(size * (2 * rank + i)) for i in range(2)]
        assert out["all_to_all_single"] == [float(rank + 10 * j) for j in range(size)]
        assert out["ring"] == [float((rank - 1) % size)] * 3
        assert out["cpu"] == [float(sum(range(1, size + 1)))] * 2
        assert out["objects"] == [{"rank": r} for r in range(size)]
        if rank == 1:
            assert out["recv"] == [7.0]


def _model(dev):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4)).to(dev)


def _train(ddp, dev, rank):
    """Five steps of SGD on rank-seeded data: the losses."""
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1 + rank)
    losses = []
    for _ in range(5):
        x, y = torch.randn(16, 32, generator=generator).to(dev), torch.randint(0, 4, (16,), generator=generator).to(dev)
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _ddp_losses(rank, size):
    dev = torch.device("cuda", 0)
    return _train(torch.nn.parallel.DistributedDataParallel(_model(dev), device_ids=[0]), dev, rank)


@pytest.mark.parametrize("init", [BESIDE_GLOO, ENGINE])
def test_torch_ddp_on_a_cuda_model_trains_as_over_gloo(init):
    ours = run_processes(2, _ddp_losses, init=init, timeout=300)
    gloo = run_processes(2, _ddp_losses, init="gloo", timeout=300)
    np.testing.assert_allclose(ours, gloo, rtol=1e-5)


def _pydist_ddp_losses(rank, size, device):
    import pydist
    dev = torch.device(device)
    return _train(pydist.DistributedDataParallel(_model(dev), bucket_cap_mb=0.01), dev, rank)  # several buckets


def test_pydists_ddp_on_a_cuda_model_trains_as_on_the_cpu():
    on_gpu = run_processes(2, _pydist_ddp_losses, "cuda:0", env={"PYDIST_CUDA_ENGINE": "1"}, timeout=300)
    on_cpu = run_processes(2, _pydist_ddp_losses, "cpu", timeout=300)
    np.testing.assert_allclose(on_gpu, on_cpu, rtol=1e-4)
