"""The seed programs (tests/seed_programs/), run the seeds' way, checked against the values they imply.

The programs live in tests/seed_programs/ and are the seed text with ``import pydist as
dist``. The ``test_seedNNN_*`` tests launch them as the seeds do: one process per rank, a
module-level ``init_process(rank, size, fn)`` that sets MASTER_ADDR/MASTER_PORT (a free port
per test, through SEED_MASTER_PORT) and calls ``init_process_group("pydist", rank=rank,
world_size=size)``; seed 004 with ``torch.multiprocessing.spawn`` and with the launcher
(pydist-run, torchrun's counterpart). They print ``Rank: r, has data ...`` lines, compared
with the expected tensors formatted by the same library. Each runs on torch tensors and on
numpy arrays. The numpy runs start their ranks the seeds' way, multiprocessing's "spawn"
(fresh interpreters, torch never imported); the torch runs fork theirs from the warm fork
server (seed_programs.launch.forked), which imported torch once: importing it again in
every rank of every test cost seconds each.

``test_sweep`` generalises the collective examples to world sizes 1..8 with each of the
four initialisations (env://, tcp://, file://, store=TCPStore) through
``pydist.testing.run_processes`` (forkserver; torch is preloaded into the fork server so
torch ranks do not pay its import each); one job per size and initialisation runs the
examples on both libraries.

No test leaves a process behind: launches are joined with a deadline and what is still
alive is killed by pid (see seed_programs.launch.spawn); ``no_leftover_children`` checks.
"""
from __future__ import annotations

import importlib.util
import multiprocessing
import os
import re
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from seed_programs import launch, sweep

from pydist.testing import free_port, run_processes
from pydist.testing.commands import run_command
from pydist.testing.processes import preload

TESTS = Path(__file__).resolve().parent

pytestmark = pytest.mark.slow  # every test spawns rank processes (or the launcher)

HAVE_TORCH = importlib.util.find_spec("torch") is not None

# Preloaded modules are imported once by the fork server (started by the first
# run_processes); children fork from it, so torch ranks start in milliseconds.
preload(*["torch"] * HAVE_TORCH)


def _torch():
    """torch, or skip the calling test: torch is optional; the torch variants need it."""
    return pytest.importorskip("torch")


def _seed_program(name: str):
    """seed_programs.<name> for the seeds that import torch (002, 003, 004); skips without torch."""
    _torch()
    return importlib.import_module(f"seed_programs.{name}")

LAUNCH_TIMEOUT = 90.0


# -- helpers ---------------------------------------------------------------------------------

class Lib:
    """An array library of the seed programs (SEED_TENSORS in the ranks' environment selects
    it, see seed_programs/tensors.py) and how it prints a tensor."""

    @property
    def seed000(self):
        """Seed 000's module, imported on first use: it imports the library SEED_TENSORS names
        (set by the ``lib`` fixture), so without torch only the numpy runs import it."""
        return importlib.import_module("seed_programs.seed000")

    @property
    def seed001(self):
        """Seed 001's module, imported on first use (see seed000)."""
        return importlib.import_module("seed_programs.seed001")

    def __init__(self, name: str, start):
        self.name = name
        self.start = start  # how its runs start their ranks: launch.spawn or launch.forked

    float = "float32"  # the seeds' float tensors: torch's default dtype, and the stand-in's

    def t(self, values, dtype: str = "int64"):
        if self.name == "torch":
            torch = _torch()
            return torch.tensor(values, dtype=getattr(torch, dtype))
        return np.array(values, dtype=dtype)

    def __repr__(self) -> str:
        return self.name


LIBS = [Lib("torch", launch.forked), Lib("numpy", launch.spawn)]


@pytest.fixture(params=LIBS, ids=repr)
def lib(request, monkeypatch) -> Lib:
    if request.param.name == "torch":
        _torch()
    monkeypatch.setenv("SEED_TENSORS", request.param.name)
    return request.param


def messages(out: str, starts: str = r"Rank: \d+,|init tentor") -> list[str]:
    """The printed messages, one per print() call, sorted.

    Ranks print concurrently and multiprocessing passes ``python -u`` on to its children,
    which write a print's text and its newline separately. launch.spawn keeps each rank's
    output whole (one write at exit); torch.multiprocessing.spawn's ranks (seed 004) do
    not, so their lines may interleave as ``A B \\n\\n``: split where messages start.
    """
    text = out.replace("\n", "")
    return sorted(part.strip() for part in re.split(f"(?=(?:{starts}))", text) if part.strip())


@pytest.fixture
def seed_port(monkeypatch) -> int:
    port = free_port()
    monkeypatch.setenv("SEED_MASTER_PORT", str(port))
    return port


@pytest.fixture(autouse=True)
def no_leftover_children():
    yield
    left = multiprocessing.active_children()
    for proc in left:
        proc.kill()
        proc.join()
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def run_seed(seed_port, capfd):
    """Launch like the seeds (a process per rank, init_process, join); return the printed
    messages. ``start``: launch.forked (warm ranks) or launch.spawn (the seeds' own start)."""

    def run(size: int, fn=None, target=None, args=(), start=launch.forked) -> list[str]:
        capfd.readouterr()
        started = time.monotonic()
        codes = start(size, fn, timeout=LAUNCH_TIMEOUT, target=target, args=args)
        out, err = capfd.readouterr()
        assert codes == [0] * size, (f"exit codes {codes} after {time.monotonic() - started:.1f} s\n"
                                     f"--- stdout\n{out}\n--- stderr\n{err}")
        return messages(out)

    return run


def has_data(rank: int, tensor, sep: str = "") -> str:
    return f"Rank: {rank}, has data{sep} {tensor}"


# -- seed 000: send/recv, all_reduce on new_group([0, 1]) ------------------------------------

def test_seed000_send_recv(lib, run_seed):
    out = run_seed(2, lib.seed000.run, start=lib.start)
    assert out == sorted([f"init tentor {lib.t([0.], lib.float)}",
                          has_data(0, lib.t([1.], lib.float)),
                          has_data(1, lib.t([1.], lib.float))])


def test_store_host_leaving_right_after_init_does_not_fail_slower_ranks(run_seed):
    """Rank 0 hosts the store, sends eagerly and exits; ranks still finishing their own
    init_process_group need that store: init returns only once every rank is done with it."""
    got = run_seed(3, target=launch.slow_init_rank, args=(0.5,))
    assert got == ["Rank: 0, has data [1. 1. 1. 1.]", "Rank: 1, has data [1. 1. 1. 1.]",
                   "Rank: 2, has data [0. 0. 0. 0.]"]


def test_seed000_all_reduce_new_group(lib, run_seed):
    dtype = lib.float
    out = run_seed(2, lib.seed000.run_all_reduce, start=lib.start)
    assert out == sorted([f"Rank: 0, random tensor: {lib.t([1., 2., 3.], dtype)}",
                          f"Rank: 1, random tensor: {lib.t([4., 5., 6.], dtype)}",
                          has_data(0, lib.t([5., 7., 9.], dtype), ":"),
                          has_data(1, lib.t([5., 7., 9.], dtype), ":")])


# -- seed 001: ping-pong and the six collectives on 4 ranks ----------------------------------

def test_seed001_ping_pong(lib, run_seed):
    # rank 0 sends 1, rank 1 adds 1 and sends it back: both end with 2
    dtype = lib.float
    out = run_seed(2, lib.seed001.run, start=lib.start)
    assert out == sorted([has_data(0, lib.t([2.], dtype)), has_data(1, lib.t([2.], dtype))])


def seed001_inputs(size: int = 4) -> list[list[int]]:
    """``arange(2) + 1 + 2 * rank``: [[1, 2], [3, 4], [5, 6], [7, 8]] on 4 ranks."""
    return [[1 + 2 * r, 2 + 2 * r] for r in range(size)]


def test_seed001_broadcast(lib, run_seed):
    out = run_seed(4, lib.seed001.run_broadcast, start=lib.start)
    assert out == sorted(has_data(r, lib.t([1, 2])) for r in range(4))


def test_seed001_scatter(lib, run_seed):
    out = run_seed(4, lib.seed001.run_scatter, start=lib.start)
    assert out == sorted(has_data(r, lib.t([r, r])) for r in range(4))


def test_seed001_gather(lib, run_seed):
    out = run_seed(4, lib.seed001.run_gather, start=lib.start)
    gathered = [lib.t([1, 2]), lib.t([3, 4]), lib.t([5, 6]), lib.t([7, 8])]
    expected = [f"Rank: 0, gather_list {gathered}"]
    expected += [has_data(r, lib.t(seed001_inputs()[r])) for r in range(4)]  # inputs unchanged
    assert out == sorted(expected)


def test_seed001_reduce(lib, run_seed):
    out = run_seed(4, lib.seed001.run_reduce, start=lib.start)
    assert has_data(3, lib.t([16, 20])) in out  # 1+3+5+7, 2+4+6+8 on dst=3
    # the seed: tensors of the other ranks "might be altered"; each rank still reports
    assert [m.split(",")[0] for m in out] == [f"Rank: {r}" for r in range(4)]


def test_seed001_all_gather(lib, run_seed):
    out = run_seed(4, lib.seed001.run_all_gather, start=lib.start)
    gathered = [lib.t([1, 2]), lib.t([3, 4]), lib.t([5, 6]), lib.t([7, 8])]
    assert out == sorted(f"Rank: {r}, gather_list {gathered}" for r in range(4))


def test_seed001_all_reduce(lib, run_seed):
    out = run_seed(4, lib.seed001.run_all_reduce, start=lib.start)
    assert out == sorted(has_data(r, lib.t([16, 20])) for r in range(4))


# -- seed 002: tcp://, file://, env:// initialisation; loss averaging; positional reduce -----

def test_seed002_initialisations(run_seed, tmp_path):
    torch, seed002 = _torch(), _seed_program("seed002")
    shared = tmp_path / "sharedfile"  # must not exist beforehand (seed 002, 2.2)
    out = run_seed(4, target=seed002.all_inits, args=(free_port(), str(shared), free_port()))
    per_init = [f"Rank: {r}, mean loss 2.5, reduce {torch.tensor([10.]) if r == 0 else '-'}" for r in range(4)]
    expected = []
    for scheme in ("tcp", "file", "env"):
        expected += [f"Rank: {r}, init {scheme}://" for r in range(4)] + per_init
    expected += [f"Rank: {r}, initialized at the end: False" for r in range(4)]
    assert out == sorted(expected)
    # "this method will always create the file and try its best to remove it at the end"
    assert not shared.exists(), "file:// init left its file behind after every rank destroyed the group"


# -- seed 003: setup/cleanup, new_group on a subset, init_process_group's full signature -----

@pytest.mark.parametrize("target", ["demo", "demo_full_signature"], ids=["setup", "full_signature"])
def test_seed003_process_group(run_seed, target):
    out = run_seed(3, target=getattr(_seed_program("seed003"), target))
    expected = [f"Rank: {r}, initialized True, backend pydist" for r in range(3)]
    expected += [f"Rank: {r}, initialized after cleanup False" for r in range(3)]
    # group [0, 2]: members sum 1 + 3; rank 1 is outside it (rank and size -1, data unchanged)
    expected += ["Rank: 0, world 0/3, group 0/2, has data tensor([4.])",
                 "Rank: 1, world 1/3, group -1/-1, has data tensor([2.])",
                 "Rank: 2, world 2/3, group 1/2, has data tensor([4.])"]
    assert out == sorted(expected)


# -- seed 004: DDP by hand under torch.multiprocessing.spawn; the torchrun snippet -----------

def test_seed004_ddp_setup_mp_spawn(seed_port, capfd):
    torch, seed004 = _torch(), _seed_program("seed004")
    import torch.multiprocessing as tmp
    world_size = 2
    context = tmp.spawn(seed004.main, args=(world_size,), nprocs=world_size, join=False)
    try:
        deadline = time.monotonic() + LAUNCH_TIMEOUT
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail("torch.multiprocessing.spawn ranks did not finish in time")
    finally:
        for proc in context.processes:
            if proc.is_alive():
                proc.kill()
            proc.join()
    out, err = capfd.readouterr()
    with torch.random.fork_rng():
        reference = seed004.train(seed004.make_model(seed=0), world_size)  # full batch, one process
    assert messages(out) == sorted(f"Rank: {r}, params {reference}" for r in range(world_size)), err


def test_seed004_torchrun_snippet(tmp_path):
    torch = _torch()
    piddir = tmp_path / "pids"
    piddir.mkdir()
    env = dict(os.environ, PIDDIR=str(piddir))
    env.pop("RANK", None)
    try:
        done = run_command([sys.executable, "-m", "pydist.run", "--nproc-per-node", "2",
                            str(TESTS / "seed_programs" / "seed004.py")], LAUNCH_TIMEOUT, env=env)
    finally:
        for pidfile in piddir.iterdir():  # workers outliving the launcher: kill by pid
            pid = int(pidfile.name)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, err
    lines = sorted(line for line in out.splitlines() if "Rank:" in line)
    assert lines == [f"[rank{r}]:Rank: {r}, local_rank {r}, world_size 2, has data {torch.tensor([3.])}"
                     for r in range(2)], out + err


# -- the warm fork server ------------------------------------------------------------------

def _frozen_objects(rank, size):
    import gc
    return gc.get_freeze_count()


def test_ranks_fork_from_a_server_whose_preloaded_objects_are_frozen():
    """pydist.testing._frozen ran in the fork server after its preloads: a rank's full
    collections skip those objects (walking them would copy the server's heap into every rank)."""
    assert all(count > 10_000 for count in run_processes(2, _frozen_objects))


# -- the collective examples at world sizes 1..8, four initialisations, numpy and torch ------

def sweep_expected(rank: int, size: int, kind: str) -> dict:
    """What seed_programs.sweep.run_all must leave on ``rank``, computed by hand."""
    inputs = seed001_inputs(size)
    total = [sum(v[0] for v in inputs), sum(v[1] for v in inputs)]  # size**2, size**2 + size
    assert total == [size * size, size * size + size]
    expected = {"kind": kind, "broadcast": [1, 2], "scatter": [rank, rank], "gather_input": inputs[rank],
                "all_gather": inputs, "all_reduce": total}
    if rank == 0:
        expected["gather"] = inputs
    if rank == size - 1:
        expected["reduce"] = total
    if size > 1:
        expected["ping_pong"] = [float(size if rank == 0 else rank + 1)]
        # outside new_group([0, 1]) the call is a no-op with one warning (naming all_reduce)
        expected["group_all_reduce"] = [5., 7., 9.] if rank < 2 else [4., 5., 6.]
        expected["group_warnings"] = 0 if rank < 2 else 1
    return expected


@pytest.mark.parametrize("init", ["env", "tcp", "file", "store"])
@pytest.mark.parametrize("size", range(1, 9))
def test_sweep(size, init):
    """Both libraries in one job per (size, init): numpy first on even sizes, torch first on
    odd ones, so that each also runs first in a freshly made group at every init."""
    libs = ["numpy", "torch"] if HAVE_TORCH else ["numpy"]
    if size % 2:
        libs.reverse()
    results = run_processes(size, sweep.run_libs, libs, init=init, timeout=LAUNCH_TIMEOUT)
    for lib_name in libs:
        kind = "Tensor" if lib_name == "torch" else "ndarray"
        for rank, per_lib in enumerate(results):
            result = per_lib[lib_name]
            if "group_warnings" in result:
                assert all("all_reduce" in text for text in result["group_warnings"]), result["group_warnings"]
                result["group_warnings"] = len(result["group_warnings"])
            assert result == sweep_expected(rank, size, kind), f"rank {rank}, {lib_name}"
