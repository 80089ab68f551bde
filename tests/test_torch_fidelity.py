"""torch's higher layers over the plugin give exactly gloo's results: functional collectives
(torch.distributed._functional_collectives, which torch 2.13 forwards to Python backends),
DTensor (redistribute, sharded matmul), FSDP2 (``fully_shard`` training) and split groups.
Each program runs in 2 real processes once on "gloo" and once on "pydist"; the results must
be equal, not close (2 ranks: every sum has the same two operands in both)."""
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as tdist  # noqa: E402

from pydist.testing import run_processes  # noqa: E402

# 2 x 2 real torch processes per test; bounded generously for a loaded 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _on_both(program):
    """``program``'s per-rank results on gloo and on pydist (asserted equal), and gloo's."""
    gloo = run_processes(2, program, init="gloo", timeout=180)
    pydist = run_processes(2, program, init="torch", timeout=180)
    assert pydist == gloo
    return gloo


def _funcol(rank, size):
    import torch.distributed._functional_collectives as funcol
    group = tdist.group.WORLD
    x = torch.arange(6, dtype=torch.float32) * (rank + 1) + 0.1 * rank
    out = {"all_reduce": funcol.all_reduce(x, "sum", group).tolist(),
           "all_reduce_max": funcol.all_reduce(x, "max", group).tolist(),
           "all_gather": funcol.all_gather_tensor(x, 0, group).tolist(),
           "reduce_scatter": funcol.reduce_scatter_tensor(x, "sum", 0, group).tolist(),
           "all_to_all": funcol.all_to_all_single(x, [3, 3], [3, 3], group).tolist(),
           # rank r sends 1 element to rank 0 and 1 + r to rank 1
           "all_to_all_uneven": funcol.all_to_all_single(x[:2 + rank], [1 + rank * r for r in range(size)],
                                                         [1, 1 + rank], group).tolist(),
           "broadcast": funcol.broadcast(x, 1, group).tolist()}
    return out


def test_functional_collectives_equal_gloo_s():
    results = _on_both(_funcol)
    x = [torch.arange(6, dtype=torch.float32) * (r + 1) + 0.1 * r for r in range(2)]
    assert results[0]["all_reduce"] == (x[0] + x[1]).tolist()
    assert results[1]["all_gather"] == torch.cat(x).tolist()


def _dtensor(rank, size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (size,))
    torch.manual_seed(0)
    a, b = torch.randn(8, 6), torch.randn(6, 4)
    rows = distribute_tensor(a, mesh, [Shard(0)])
    cols = distribute_tensor(a, mesh, [Shard(1)])
    out = {"local_rows": rows.to_local().tolist(),
           "shard0_to_replicate": rows.redistribute(mesh, [Replicate()]).to_local().tolist(),
           "shard0_to_shard1": rows.redistribute(mesh, [Shard(1)]).to_local().tolist(),
           "row_matmul": (rows @ distribute_tensor(b, mesh, [Replicate()])).full_tensor().tolist(),
           # Shard(1) @ Shard(0) is a Partial sum: reducing it is an all_reduce / reduce_scatter
           "partial_matmul": (cols @ distribute_tensor(b, mesh, [Shard(0)])).full_tensor().tolist(),
           "partial_to_shard": (cols @ distribute_tensor(b, mesh, [Shard(0)])).redistribute(
               mesh, [Shard(0)]).to_local().tolist()}
    return out


def test_dtensor_redistribute_and_matmul_equal_gloo_s():
    results = _on_both(_dtensor)
    torch.manual_seed(0)
    a, b = torch.randn(8, 6), torch.randn(6, 4)
    assert results[0]["shard0_to_replicate"] == a.tolist()
    assert torch.allclose(torch.tensor(results[1]["partial_matmul"]), a @ b, atol=1e-5)


def _fsdp2(rank, size, steps):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (size,))  # fully_shard's default mesh is CUDA's where a GPU is visible
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    losses = []
    for _ in range(steps):
        inputs, targets = torch.randn(4, 8, generator=generator), torch.randn(4, 3, generator=generator)
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "weights": [p.full_tensor().tolist() for p in model.parameters()]}


def _avg_reduce_scatter(rank, size):
    out = torch.empty(2)
    tdist.reduce_scatter_tensor(out, torch.arange(4, dtype=torch.float32) + 10 * rank, op=tdist.ReduceOp.AVG)
    return out.tolist()


def test_fsdp2_training_equals_gloo_s():
    """FSDP2 reduces gradients with reduce_scatter_tensor(op=AVG). torch 2.8's gloo returns the
    sum there (fixed by 2.11): against that gloo the check is pydist's mean, and the training
    comparison, whose reference is wrong, is skipped saying so."""
    gloo = run_processes(2, _avg_reduce_scatter, init="gloo", timeout=180)
    if gloo != [[5.0, 6.0], [7.0, 8.0]]:
        assert gloo == [[10.0, 12.0], [14.0, 16.0]], gloo  # the sum: the known gloo bug, nothing else
        assert run_processes(2, _avg_reduce_scatter, init="torch", timeout=180) == [[5.0, 6.0], [7.0, 8.0]]
        pytest.skip(f"torch {torch.__version__}'s gloo sums reduce_scatter_tensor(op=AVG): no reference for FSDP2")
    results = _on_both(_fsdp2_three_steps)
    assert results[0]["weights"] == results[1]["weights"]  # every rank ends with the same model
    assert results[0]["losses"] != results[1]["losses"]  # trained on different data


def _fsdp2_three_steps(rank, size):
    return _fsdp2(rank, size, 3)


def _split(rank, size):
    parent = tdist.group.WORLD
    try:
        group = tdist.split_group(parent, split_ranks=[[0], [1]])
        kind = "split_group"
    except Exception as error:  # noqa: BLE001 - which torch raises is the finding
        group, kind = None, f"{type(error).__name__}: {error}"
    if group is None:
        group, _ = tdist.new_subgroups(1)
    t = torch.tensor([rank + 1.0])
    tdist.all_reduce(t, group=group)
    pair = tdist.new_group([0, 1])
    u = torch.tensor([rank + 1.0])
    tdist.all_reduce(u, group=pair)
    return {"kind": kind, "alone": t.item(), "pair": u.item()}


def test_split_groups_equal_gloo_s():
    results = _on_both(_split)
    # torch 2.13 splits only groups bound to a device (init_process_group(device_id=...), an
    # accelerator): on CPU it refuses, for gloo as for pydist, so new_subgroups stands in
    assert results[0]["kind"].startswith("RuntimeError: No device associated with the default pg"), results
    assert [r["alone"] for r in results] == [1.0, 2.0] and [r["pair"] for r in results] == [3.0, 3.0]


def test_a_late_shared_memory_creator_is_awaited_through_torch_s_store():
    """The plugin's groups meet through torch's store, whose wait raises torch's own
    DistStoreError at each liveness poll; the plugin hands pydist that store wrapped
    (pydist.torch._store.TorchStore), so waiting for a late arena creator goes on (FSDP2's
    first collective on a loaded machine failed here after 100 ms)."""
    import threading

    from pydist.core.deadline import Deadline
    from pydist.torch._store import TorchStore
    from pydist.transport.shm.sharing import _wait_for_name
    store = TorchStore(tdist.HashStore())
    late = threading.Timer(0.5, store.set, ("arena/name", "segment"))
    late.start()
    checks = []
    _wait_for_name(store, "arena/name", 0, Deadline.after(30), alive=lambda: checks.append(1))
    late.join()
    assert store.get("arena/name") == b"segment" and checks, checks
