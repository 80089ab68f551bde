"""pydist's DistributedDataParallel against single-process training, and its torch behaviours.

Equivalence: N SGD steps on 2 and 3 ranks, each on its slice of every batch, must end with
the parameters (atol 1e-5) of one process training on the whole batches; models start from
a different seed per rank, so construction's broadcast from rank 0 is checked too. Then:
bucket layout, unused parameters, no_sync, comm hooks, join() with uneven inputs, the
overlap of bucket all_reduces with backward, and construction errors. Ranks are threads
(one process test runs real processes); rank functions live in tests/ddp_programs.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from ddp_programs import training  # noqa: E402
from torch import nn  # noqa: E402

import pydist as dist  # noqa: E402
from pydist.testing import run_processes, run_threads  # noqa: E402
from pydist.torch import hooks  # noqa: E402
from pydist.torch.ddp import DistributedDataParallel  # noqa: E402

ATOL = 1e-5


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Thread-ranks share torch's intra-op pool; on 2 cores one thread each is fastest."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def assert_close(got: dict, want: dict, atol: float = ATOL, what: str = "") -> None:
    assert got.keys() == want.keys()
    for name in want:
        difference = (torch.as_tensor(got[name]).double() - torch.as_tensor(want[name]).double()).abs().max().item()
        assert difference <= atol, f"{what}{name}: max difference {difference:.3g} > {atol}"


# -- equivalence with single-process training ------------------------------------------------

def parameters_only(state: dict) -> dict:
    """Without BatchNorm's running statistics: those end as rank 0's on rank 0 only."""
    return {k: v for k, v in state.items() if "running" not in k and "num_batches" not in k}


@pytest.mark.slow
def test_processes_match_single_process_training():
    """Real processes: Linear layers and a BatchNorm (buffers broadcast from rank 0) on 2 ranks."""
    results = run_processes(2, training.train, "bn", steps=4, timeout=90)
    want = training.reference("bn", steps=4, size=2)
    for rank, result in enumerate(results):
        assert_close(parameters_only(result["state"]), parameters_only(want), what=f"rank {rank} ")
    assert_close(results[0]["state"], want, what="rank 0 ")


@pytest.mark.slow  # processes or training: up to 2 s a case here
@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("model", ["mlp", "bn"])
def test_threads_match_single_process_training(size, model):
    results = run_threads(size, training.train, model, steps=4)
    want = training.reference(model, steps=4, size=size)
    for rank, result in enumerate(results):
        got, expected = (result["state"], want) if rank == 0 else (parameters_only(result["state"]),
                                                                    parameters_only(want))
        assert_close(got, expected, what=f"rank {rank} ")
        assert all(key.startswith("module.") for key in result["keys"])  # torch's DDP state_dict keys
        assert not result["grads_are_views"]


@pytest.mark.slow  # training: 1.2 s here
def test_gradient_as_bucket_view_matches_and_grads_are_bucket_views():
    results = run_threads(2, training.train, "mlp", steps=4, gradient_as_bucket_view=True, bucket_cap_mb=0.0005)
    want = training.reference("mlp", steps=4, size=2)
    for result in results:
        assert_close(result["state"], want)
        assert result["grads_are_views"]


def test_comm_stats_count_bucket_all_reduces():
    results = run_threads(2, training.train, "mlp", steps=3, bucket_cap_mb=0.0005)
    param_bytes = sum(p.numel() * 4 for p in training.make_model("mlp").parameters())
    for result in results:
        stats = result["stats"]
        assert stats["allreduces"] == 3 * len(result["buckets"])
        assert stats["bytes_reduced"] == 3 * param_bytes
        assert stats["seconds_communicating"] > 0


# -- buckets -----------------------------------------------------------------------------------

class Sized(nn.Module):
    """Parameters of chosen sizes (float32 elements), p0 registered first."""

    def __init__(self, sizes: list[int], dtypes: list[torch.dtype] | None = None):
        super().__init__()
        for i, n in enumerate(sizes):
            dtype = dtypes[i] if dtypes else torch.float32
            self.register_parameter(f"p{i}", nn.Parameter(torch.zeros(n, dtype=dtype)))


def _buckets(module: nn.Module, **kwargs) -> list[list[str]]:
    def body(rank, size):
        return DistributedDataParallel(module, **kwargs)._get_bucket_params()
    return run_threads(1, body)[0]


def test_buckets_reverse_registration_order_small_first_bucket():
    """First bucket closes at 1 MiB, later ones at bucket_cap_mb (2 MiB); a cap too small
    for any parameter gives one bucket per parameter; dtypes never share a bucket."""
    assert _buckets(Sized([10, 300_000, 300_000, 100_000, 100_000, 100_000]), bucket_cap_mb=2) == [
        ["p5", "p4", "p3"], ["p2", "p1"], ["p0"]]
    assert _buckets(training.make_model("mlp"), bucket_cap_mb=1e-6) == [
        ["4.bias"], ["4.weight"], ["2.bias"], ["2.weight"], ["0.bias"], ["0.weight"]]
    assert _buckets(training.make_model("mlp"), bucket_cap_mb=0.0005) == [
        ["4.bias", "4.weight", "2.bias", "2.weight"], ["0.bias", "0.weight"]]
    assert _buckets(training.make_model("mlp")) == [["4.bias", "4.weight", "2.bias", "2.weight", "0.bias",
                                                     "0.weight"]]
    assert _buckets(Sized([4, 4, 4], [torch.float32, torch.float64, torch.float32])) == [["p2", "p0"], ["p1"]]


@pytest.mark.parametrize("size", [2, 3])
def test_tiny_buckets_still_match(size):
    """(static_graph is accepted and changes nothing.)"""
    results = run_threads(size, training.train, "mlp", steps=3, bucket_cap_mb=1e-6, static_graph=True)
    want = training.reference("mlp", steps=3, size=size)
    for result in results:
        assert len(result["buckets"]) == 6
        assert_close(result["state"], want)


# -- unused parameters -------------------------------------------------------------------------

def test_unused_parameter_without_find_unused_raises_naming_it():
    results = run_threads(2, training.train_unused, steps=3)
    for rank, result in enumerate(results):
        assert result["step"] == 1, result
        message = result["error"]
        assert "Expected to have finished reduction in the prior iteration" in message
        assert "find_unused_parameters=True" in message
        assert f"Parameter indices which did not receive grad for rank {rank}: 2 3 4 5" in message
        assert "extra.weight, extra.bias, never.weight, never.bias" in message


def test_find_unused_parameters_matches_and_leaves_unused_grads_alone():
    results = run_threads(2, training.train_unused, steps=3, find_unused_parameters=True)
    want = training.reference_unused(2, steps=3)
    for result in results:
        assert "error" not in result, result
        assert_close(result["state"], want)
        assert result["grads"]["never.weight"] is None and result["grads"]["extra.bias"] is None


@pytest.mark.parametrize("size", [2, 3])
def test_parameter_used_on_one_rank_only(size):
    results = run_threads(size, training.train_unused, steps=3, extra_on=(0,), find_unused_parameters=True,
                          bucket_cap_mb=1e-6)
    want = training.reference_unused(size, steps=3, extra_on=(0,))
    for result in results:
        assert_close(result["state"], want)
        assert result["grads"]["extra.weight"] is not None and result["grads"]["never.weight"] is None
    for other in results[1:]:
        assert (other["grads"]["extra.weight"] == results[0]["grads"]["extra.weight"]).all()


def test_output_outside_the_loss_with_find_unused():
    """A forward output that takes no part in the loss: its parameters end as unused, no hang."""

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 2), nn.Linear(3, 2)

        def forward(self, x):
            return self.a(x), self.b(x)

    def body(rank, size):
        ddp = DistributedDataParallel(TwoHeads(), find_unused_parameters=True)
        for _ in range(2):
            a, _b = ddp(torch.ones(2, 3) * (rank + 1))
            a.sum().backward()
        return ddp.module.a.weight.grad.clone(), ddp.module.b.weight.grad

    results = run_threads(2, body)
    assert torch.equal(results[0][0], results[1][0]) and results[0][1] is None


# -- no_sync -----------------------------------------------------------------------------------

@pytest.mark.parametrize("as_view", [False, True])
def test_no_sync_accumulates_then_averages_the_sum(as_view):
    results = run_threads(2, training.train_no_sync, micro_steps=3, steps=2, gradient_as_bucket_view=as_view)
    want = training.reference_no_sync(2, micro_steps=3, steps=2)
    for result in results:
        assert_close(result["state"], want)
        buckets = result["buckets"]
        assert result["allreduces_after_no_sync"] == [0, 0, buckets, buckets]  # nothing sent inside no_sync
        assert result["stats"]["allreduces"] == 2 * buckets


# -- communication hooks -----------------------------------------------------------------------

@pytest.mark.parametrize("hook,atol", [("allreduce", ATOL), ("fp16", 2e-3), ("bf16", 3e-2)])
def test_hooks_match_within_their_precision(hook, atol):
    results = run_threads(2, training.train, "mlp", steps=3, hook=hook, bucket_cap_mb=0.0005)
    want = training.reference("mlp", steps=3, size=2)
    for result in results:
        assert_close(result["state"], want, atol=atol)
    assert_close(results[0]["state"], results[1]["state"], atol=0)


def test_torch_default_hooks_and_wrappers_run_on_pydist():
    """torch's allreduce_hook is replaced by pydist's; torch's compress wrapper wraps pydist's hook."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    def body(rank, size, which):
        ddp = DistributedDataParallel(training.make_model("mlp", seed=rank))
        hook = default_hooks.allreduce_hook if which == "torch" else default_hooks.fp16_compress_wrapper(
            hooks.allreduce_hook)
        ddp.register_comm_hook(None, hook)
        x, y = training.batches(1, 8)[0]
        training.loss_fn(ddp(x[rank * 4:(rank + 1) * 4]), y[rank * 4:(rank + 1) * 4]).backward()
        return [p.grad.clone() for p in ddp.parameters()]

    net = training.make_model("mlp")
    x, y = training.batches(1, 8)[0]
    training.loss_fn(net(x), y).backward()
    for which, atol in [("torch", ATOL), ("wrapper", 2e-3)]:
        for grads in run_threads(2, body, which):
            for got, param in zip(grads, net.parameters()):
                assert (got - param.grad).abs().max().item() <= atol, which


def test_custom_hook_result_is_written_into_the_gradients():
    """A hook that doubles (no communication): gradients end as twice the local ones."""

    def double(state, bucket):
        state.append(bucket.index())
        future = torch.futures.Future()
        future.set_result(bucket.buffer() * 2)
        return future

    def body(rank, size):
        net = training.make_model("mlp")
        ddp = DistributedDataParallel(net, bucket_cap_mb=0.0005)
        seen: list[int] = []
        ddp.register_comm_hook(seen, double)
        x = torch.randn(4, training.IN, generator=torch.Generator().manual_seed(rank))
        ddp(x).sum().backward()
        local = training.make_model("mlp")
        local(x).sum().backward()
        return seen, all(torch.allclose(p.grad, 2 * q.grad) for p, q in zip(ddp.parameters(), local.parameters()))

    for seen, doubled in run_threads(2, body):
        assert seen == [0, 1] and doubled


def test_register_comm_hook_errors():
    def body(rank, size):
        ddp = DistributedDataParallel(training.make_model("mlp"))
        with pytest.raises(TypeError, match="must be callable"):
            ddp.register_comm_hook(None, 42)
        with pytest.raises(TypeError, match="pydist ProcessGroup or None"):
            ddp.register_comm_hook("a torch group", hooks.fp16_compress_hook)
        ddp.register_comm_hook(None, hooks.allreduce_hook)
        with pytest.raises(RuntimeError, match="can only be called once"):
            ddp.register_comm_hook(None, hooks.allreduce_hook)
        late = DistributedDataParallel(training.make_model("mlp"))
        late(torch.zeros(1, training.IN)).sum().backward()
        with pytest.raises(RuntimeError, match="before the first forward"):
            late.register_comm_hook(None, hooks.allreduce_hook)

    run_threads(2, body)


# -- join() with uneven inputs -----------------------------------------------------------------

@pytest.mark.parametrize("divide_by_initial", [True, False])
def test_join_uneven_inputs(divide_by_initial):
    counts = [3, 5]
    results = run_threads(2, training.train_join, counts, divide_by_initial_world_size=divide_by_initial)
    want = training.reference_join(2, counts, divide_by_initial_world_size=divide_by_initial)
    for result in results:
        assert_close(result["state"], want)
    assert_close(results[0]["state"], results[1]["state"], atol=0)
    assert results[0]["stats"]["allreduces"] == results[1]["stats"]["allreduces"] == 5  # shadowed ones too


@pytest.mark.slow
def test_join_processes_uneven_inputs():
    counts = [3, 5]
    results = run_processes(2, training.train_join, counts, timeout=90)
    want = training.reference_join(2, counts)
    for result in results:
        assert_close(result["state"], want)


def test_join_with_find_unused_parameters_and_a_hook():
    """The joined rank also shadows the used-parameter flags, and runs the comm hook on zeros."""
    counts = [4, 2]
    results = run_threads(2, training.train_join, counts, hook="allreduce", find_unused_parameters=True,
                          bucket_cap_mb=0.0005)
    want = training.reference_join(2, counts)
    for result in results:
        assert_close(result["state"], want)


def test_join_three_ranks_with_buffers():
    """BatchNorm buffers are broadcast from a rank still training; all ranks end equal."""
    results = run_threads(3, training.train_join, [2, 4, 3], model="bn")
    for result in results[1:]:
        assert_close(result["state"], results[0]["state"], atol=0)


def test_join_throw_on_early_termination():
    def body(rank, size):
        ddp = DistributedDataParallel(training.make_model("mlp"))
        steps = 0
        try:
            with ddp.join(throw_on_early_termination=True):
                for _ in range(2 + rank):
                    ddp(torch.zeros(2, training.IN)).sum().backward()
                    steps += 1
        except RuntimeError as error:
            return steps, str(error)
        return steps, None

    (steps0, error0), (steps1, error1) = run_threads(2, body)
    assert (steps0, steps1) == (2, 2)
    assert "exhausted all inputs" in error0 and "Throwing across all ranks" in error1


# -- overlap -------------------------------------------------------------------------------------

def _record_backward(module_name: str):
    def body(rank, size):
        net = training.make_model(module_name, seed=rank)
        events: list[tuple[str, object]] = []
        for name, param in net.named_parameters():  # run before DDP's hook on the same parameter
            param.register_post_accumulate_grad_hook(lambda _p, name=name: events.append(("grad", name)))
        ddp = DistributedDataParallel(net, bucket_cap_mb=1e-6)
        launch = ddp.reducer.launch
        finalize = ddp.reducer.finalize_backward

        def recording_launch(bucket):
            events.append(("launch", bucket.index))
            launch(bucket)

        def recording_finalize():
            events.append(("finalize", None))
            finalize()

        ddp.reducer.launch = recording_launch
        ddp.reducer.finalize_backward = recording_finalize
        x, y = training.batches(1, 4)[0]
        training.loss_fn(ddp(x), y).backward()
        return events, ddp._get_bucket_params()
    return body


def test_first_bucket_is_launched_while_backward_is_still_running():
    for events, buckets in run_threads(2, _record_backward("mlp")):
        launches = [index for kind, index in events if kind == "launch"]
        assert launches == list(range(len(buckets)))
        assert events.index(("launch", 0)) < events.index(("grad", "0.weight"))  # first layer: last gradient
        assert events[-1] == ("finalize", None)
        for index, names in enumerate(buckets):  # each bucket goes as soon as its gradients are in
            assert events.index(("launch", index)) == events.index(("grad", names[-1])) + 1


def test_buckets_launch_in_index_order_when_ready_out_of_order():
    """Swapped: `first` (bucket 1, 2) gets gradients before `second` (buckets 0, 1); launches wait."""
    for events, buckets in run_threads(2, _record_backward("swapped")):
        assert buckets == [["second.bias"], ["second.weight"], ["first.bias"], ["first.weight"]]
        launches = [index for kind, index in events if kind == "launch"]
        assert launches == [0, 1, 2, 3]
        assert events.index(("launch", 2)) > events.index(("grad", "second.weight"))


# -- construction ------------------------------------------------------------------------------

def test_construction_checks_the_model_across_ranks():
    def body(rank, size):
        net = nn.Sequential(nn.Linear(4, 3 if rank != 1 else 5))
        try:
            DistributedDataParallel(net)
        except ValueError as error:
            return str(error)

    for message in run_threads(3, body):
        assert "'0.weight': shape (3, 4) dtype torch.float32 on ranks [0, 2]; shape (5, 4) dtype torch.float32 " \
               "on ranks [1]" in message
        assert "'0.bias'" in message


def test_construction_errors():
    def body(rank, size):
        with pytest.raises(ValueError, match="runs CPU and CUDA modules.*meta"):
            DistributedDataParallel(nn.Linear(2, 2, device="meta"))
        frozen = nn.Linear(2, 2).requires_grad_(False)
        with pytest.raises(RuntimeError, match="doesn't have any parameter that requires a gradient"):
            DistributedDataParallel(frozen)
        with pytest.raises(TypeError, match="pydist ProcessGroup"):
            DistributedDataParallel(nn.Linear(2, 2), process_group="world")
        with pytest.raises(ValueError, match="device_ids"):
            DistributedDataParallel(nn.Linear(2, 2), device_ids=[0])

    run_threads(2, body)
    with pytest.raises(ValueError, match="init_process_group"):
        DistributedDataParallel(nn.Linear(2, 2))


def test_subgroup_and_no_grad_forward():
    """DDP over a subgroup; a forward under no_grad neither syncs nor disturbs the state."""

    def body(rank, size):
        pair = dist.new_group([0, 1])
        if rank > 1:
            return None
        ddp = DistributedDataParallel(training.make_model("mlp", seed=rank), process_group=pair)
        with torch.no_grad():
            ddp(torch.ones(1, training.IN))
        ddp(torch.ones(2, training.IN) * rank).sum().backward()
        return [p.grad.clone() for p in ddp.parameters()]

    results = run_threads(3, body)
    for a, b in zip(results[0], results[1]):
        assert torch.equal(a, b)
