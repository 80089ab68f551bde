"""Future callbacks that wait on another collective of the same group (torch's PowerSGD
does): they run off the group's progress thread, so the nested collective can progress.
Each torch program runs at 2 ranks on a gloo group and on a pydist group, compared."""
import sys
import threading

import numpy as np
import pytest

import pydist as dist
from pydist.testing import run_processes, run_threads

torch = pytest.importorskip("torch")
import torch.distributed as tdist  # noqa: E402
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd  # noqa: E402

pytestmark = pytest.mark.slow
BACKENDS = ("gloo", "pydist")
TIMEOUT = 90  # generous (under the per-test timeout): a deadlock shows as this; the programs take seconds


#: the environment of a CPU program that must not see a GPU: torch's PowerSGD hooks call
#: ``torch.cuda.synchronize(<the gradients' device>)`` whenever CUDA is available, which fails
#: for CPU gradients (on gloo too)
NO_GPU = {"CUDA_VISIBLE_DEVICES": ""}


def _on_both(program, *args, env=None) -> dict:
    """{backend: the ranks' results} of ``program(rank, size, group, *args)`` on a new
    group of each backend (the default group is the plugin's; gloo gets a new_group)."""
    return run_processes(2, _with_groups, program, args, init="torch", timeout=TIMEOUT, env=env)


def _with_groups(rank, size, program, args):
    groups = {backend: tdist.new_group(backend=backend) for backend in BACKENDS}
    return {backend: program(rank, size, group, *args) for backend, group in groups.items()}


def _nested_callback(rank, size, group):
    fut = tdist.all_reduce(torch.ones(4), group=group, async_op=True).get_future()

    def cb(f):
        return tdist.all_reduce(torch.ones(2), group=group, async_op=True).get_future().wait()[0]

    chained = fut.then(cb)
    return chained.wait().tolist()


def test_then_callback_waiting_on_a_collective_of_its_group():
    for results in _on_both(_nested_callback):
        assert results["pydist"] == results["gloo"] == [2.0, 2.0]


def _nested_chain(rank, size, group):
    """Three chained callbacks, each waiting on a collective issued inside it (PowerSGD's shape)."""
    fut = tdist.all_reduce(torch.full((3,), float(rank)), group=group, async_op=True).get_future()

    def step(f):
        value = f.value()[0] if isinstance(f.value(), list) else f.value()
        return tdist.all_reduce(value + 1, group=group, async_op=True).get_future().wait()[0]

    return fut.then(step).then(step).then(step).wait().tolist()


def test_chained_callbacks_each_waiting_on_a_nested_collective():
    for results in _on_both(_nested_chain):
        assert results["pydist"] == results["gloo"]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


PARAMETERS = 4  # _model's tensors: two weights, two biases


def _train(model, rank, size, steps):
    generator = torch.Generator().manual_seed(1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        x, y = torch.randn(4 * size, 8, generator=generator), torch.randint(0, 3, (4 * size,), generator=generator)
        mine = slice(4 * rank, 4 * rank + 4)
        loss = torch.nn.functional.cross_entropy(model(x[mine]), y[mine])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _batched_orthogonalize(matrices, epsilon=0):
    """torch 2.13's batched_powerSGD_hook passes its 2-D Q to ``_orthogonalize``, which takes
    a batch (3-D) and raises AssertionError on gloo too: give it a batch of one (a view,
    so the in-place orthogonalisation lands in Q)."""
    return _TORCH_ORTHOGONALIZE(matrices.unsqueeze(0) if matrices.dim() == 2 else matrices, epsilon)


_TORCH_ORTHOGONALIZE = powersgd._orthogonalize


def _ddp_powersgd(rank, size, group, hook_name, steps):
    powersgd._orthogonalize = _batched_orthogonalize  # the same on both backends
    ddp = torch.nn.parallel.DistributedDataParallel(_model(), process_group=group)
    state = powersgd.PowerSGDState(process_group=group, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                   random_seed=0)
    ddp.register_comm_hook(state, getattr(powersgd, hook_name))
    _train(ddp, rank, size, steps)
    return [p.detach().numpy().copy() for p in ddp.module.parameters()]


@pytest.mark.parametrize("hook_name", ["powerSGD_hook", "batched_powerSGD_hook"])
def test_ddp_powersgd_matches_gloo(hook_name):
    steps = 5  # compressed from step 2 on
    runs = _on_both(_ddp_powersgd, hook_name, steps, env=NO_GPU)
    assert len(runs) == 2  # both ranks' parameters
    for results in runs:
        assert len(results["pydist"]) == len(results["gloo"]) == PARAMETERS
        for got, want in zip(results["pydist"], results["gloo"], strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert not np.allclose(results["pydist"][0], _model()[0].weight.detach().numpy())  # it trained


def _native_nested(rank, size):
    """pydist's own API: a Work callback and a future callback each run a blocking
    all_reduce on the same group; both finish."""
    group = dist.new_group(list(range(size)))  # explicit: a callback thread has no thread-rank's default group
    got = {}
    done = {"work": threading.Event(), "future": threading.Event()}

    def nested(key):
        def callback(_):
            t = np.ones(2)
            dist.all_reduce(t, group=group)
            got[key] = t.tolist()
            done[key].set()
        return callback

    dist.all_reduce(np.ones(4), group=group, async_op=True).add_done_callback(nested("work"))
    done["work"].wait(TIMEOUT)
    dist.all_reduce(np.ones(4), group=group, async_op=True).get_future().add_done_callback(nested("future"))
    done["future"].wait(TIMEOUT)
    dist.destroy_process_group(group)
    return got


def test_pydist_work_callbacks_may_run_collectives_of_their_group():
    for got in run_threads(2, _native_nested, timeout=TIMEOUT):
        assert got == {"work": [2.0, 2.0], "future": [2.0, 2.0]}


#: a torch future's ``then`` callback is still running on pydist's callback runner when the
#: main thread ends; the child future's value is printed by the callback's last step
_ENDING_INSIDE_A_CALLBACK = """
import threading, time, torch
from pydist.groups.callbacks import RUNNER
source, started = torch.futures.Future(), threading.Event()
def slow(future):
    started.set()
    time.sleep(0.3)  # the main thread reaches the interpreter's exit meanwhile
    print("callback ended", flush=True)
    return future.value()
child = source.then(slow)
RUNNER.run(lambda: source.set_result(1))
started.wait()
"""


def test_a_process_ending_while_a_callback_runs_inside_torch_exits_cleanly():
    """Before: Python finalised while the runner's daemon thread was inside torch's C++
    ``set_result``, and the process aborted (SIGABRT: "PyEval_SaveThread: ... the GIL is
    released", or "terminate called without an active exception": a torch-over-MPI test's
    rare failure at exit). Now the runner's tasks end before Python finalises."""
    from pydist.testing.commands import run_command

    done = run_command([sys.executable, "-c", _ENDING_INSIDE_A_CALLBACK], timeout=TIMEOUT)
    assert (done.returncode, done.stdout.strip()) == (0, "callback ended"), done.stderr
