"""pydist's MPI backend under the venv's mpiexec: the conformance suite at -n 1..4, targeted
checks (run_scripts/mpi_checks.py: arguments, tensors, async, any-source, subgroups, MPI
errors, timeouts) and torch.distributed over MPI through the plugin (run_scripts/mpi_torch.py:
every call, and torch DDP equal to the native path). Skipped only without mpi4py."""
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest

if importlib.util.find_spec("mpi4py") is None:
    pytest.skip("mpi4py is not installed (pip install mpi4py mpich)", allow_module_level=True)

from child_env import with_tests_on_path  # noqa: E402

from pydist.bench.backends import mpiexec_path  # noqa: E402
from pydist.testing.commands import CommandTimeout, run_command  # noqa: E402
from pydist.testing.conformance import CASES  # noqa: E402

pytestmark = pytest.mark.slow  # every test runs mpiexec

SCRIPTS = Path(__file__).parent / "run_scripts"
MPIEXEC = mpiexec_path() or "mpiexec"  # the venv's (pip install mpich), else PATH's


def _mpich_segments() -> set[str]:
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith("mpich")}
    except FileNotFoundError:
        return set()


def run_mpi(n: int, args: list[str], timeout: float = 60, env: dict[str, str] | None = None) -> str:
    """Run ``python args...`` under ``mpiexec -n n``; its stdout. On timeout the whole process
    group is killed and MPICH's shared memory left behind by it removed."""
    before = _mpich_segments()
    try:
        done = run_command([MPIEXEC, "-n", str(n), sys.executable, *args], timeout,
                           env=with_tests_on_path({**os.environ, "PYTHONUNBUFFERED": "", **(env or {})}))
    except CommandTimeout:
        for name in _mpich_segments() - before:
            Path("/dev/shm", name).unlink(missing_ok=True)
        raise
    assert done.returncode == 0, (f"mpiexec -n {n} {' '.join(args)} exited with {done.returncode}\n"
                                  f"{done.stdout}\n{done.stderr}")
    return done.stdout


def run_ranks(n: int, args: list[str], tmp_path: Path, **kwargs) -> list[dict]:
    """Run a script that writes each rank's result to $PYDIST_RESULTS/<rank>.json (stdout of
    several ranks can interleave); the results in rank order."""
    env = {**kwargs.pop("env", {}), "PYDIST_RESULTS": str(tmp_path)}
    out = run_mpi(n, args, env=env, **kwargs)
    files = sorted(tmp_path.glob("*.json"), key=lambda path: int(path.stem))
    assert [int(path.stem) for path in files] == list(range(n)), out
    return [json.loads(path.read_text()) for path in files]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_conformance_suite_under_mpiexec(n):
    out = run_mpi(n, ["-m", "pydist.testing.conformance", "--backend", "mpi"], timeout=120)
    summaries = re.findall(r"rank (\d+)/(\d+): (\d+) case groups, (\d+) failures", out)  # lines may interleave
    assert sorted(summaries) == [(str(r), str(n), str(len(CASES)), "0") for r in range(n)], out


def _check_ranks(per_rank: list[dict], size: int) -> None:
    for rank, got in enumerate(per_rank):
        for name, value in got.items():
            assert not (isinstance(value, str) and value.startswith("error:")), f"rank {rank} {name}: {value}"
        init = got["init_args"]
        assert f"rank: {(rank + 1) % (size + 1)} was given" in init["rank"] and f"assigns rank {rank}" in init["rank"]
        assert f"world_size: {size + 1} was given" in init["world_size"] and f"world_size {size}" in init["world_size"]
        assert init["backend"] == "mpi" and init["rank_size"] == [rank, size]
        assert got["reinit"] == [size * (size - 1) // 2]
        assert set(got["bad_args"].values()) == {"ValueError"}
        tensors = got["tensors"]
        assert tensors["bf16_sum"] == [size * (size + 1) / 2] * 5
        assert tensors["bf16_avg"] == [(size - 1) / 2] * 3
        total = size * (size + 1) // 2
        assert tensors["strided"] == [[(4 * r + c) * (total if c == 1 else rank + 1) for c in range(4)]
                                      for r in range(3)]
        assert tensors["big_endian"] == [size * i + size * (size - 1) // 2 for i in range(4)]
        assert tensors["bf16_gather"] == [[r + 0.5] * 2 for r in range(size)]
        sums = got["async"]["sums"]
        assert sums == [size * i + size * (size - 1) / 2 for i in range(4)]
        assert got["async"]["future"] == got["async"]["fut_buf"] == [size] * 3
        assert got["async"]["monitored_barrier"] == "passed"
        if size > 1:
            assert got["async"]["p2p_completed"] is True
            assert got["async"]["p2p"] == [(rank - 1) % size] * 3
            assert got["async"]["p2p_future"] == 10 * ((rank - 1) % size)
        subgroups = got["subgroups"]
        assert subgroups["backwards_rank"] == size - 1 - rank
        assert subgroups["backwards_bcast"] == [size - 1.0]
        assert subgroups["objects"] == list(reversed(range(size)))
        if rank < 2 and size > 1:
            assert subgroups["pair"] == [3.0]
        if rank in (1, 2) and size > 2:
            assert subgroups["mid"] == [4]
    if size > 1:
        assert per_rank[0]["any_source"]["world"] == [[r, r] for r in range(1, size)]
    if size > 2:
        assert per_rank[1]["any_source"]["subgroup"] == list(range(2, size))


def _check_failures(per_rank: list[dict]) -> None:
    errors = per_rank[1]["errors"]
    assert "MPI error on rank 1" in errors["p2p"] and "truncated" in errors["p2p"].lower()
    assert errors["collective"].startswith("broadcast (seq 1): MPI error on rank 1")
    timeouts = per_rank[0]["timeouts"]
    assert timeouts["collective"].startswith("all_reduce (seq 1) on rank 0: Timed out waiting 1000ms")
    assert 0.9 < timeouts["collective_seconds"] < 30.0  # its 1 s timeout (the message says); generous: load
    assert "is broken" in timeouts["after"]
    assert timeouts["p2p"] == "recv from rank 1 (tag 77): Timed out waiting 1000ms for rank 1"
    assert 0.9 < timeouts["p2p_seconds"] < 30.0
    assert per_rank[1]["timeouts"]["late"] == [2.0] * 4  # the abandoned all_reduce still completes


@pytest.mark.parametrize("n", [1, 2, 4])
def test_targeted_checks(n, tmp_path):
    per_rank = run_ranks(n, [str(SCRIPTS / "mpi_checks.py")], tmp_path, timeout=90)
    _check_ranks(per_rank, n)
    if n > 1:
        _check_failures(per_rank)


def test_span_joins_only_arrays_back_to_back():
    """What lets all_gather_into_tensor and all_to_all_single run without staging copies."""
    from pydist.engines._mpi_buffers import span
    base = np.arange(10, dtype=np.int32)
    joined = span([base[0:3], base[3:3], base[3:7], base[7:10]])
    assert joined is not None and np.shares_memory(joined, base) and joined.tolist() == list(range(10))
    assert span([base[0:3], base[4:7]]) is None  # a gap
    assert span([base[3:6], base[0:3]]) is None  # out of order
    assert span([base[0:3], base[3:6].view(np.float32)]) is None  # another dtype
    assert span([np.zeros(0), np.zeros(0)]).size == 0


def test_without_mpi4py_init_names_the_fix():
    code = ("import sys; sys.modules['mpi4py'] = None\nimport pydist\n"
            "try:\n    pydist.init_process_group('mpi')\nexcept RuntimeError as e:\n    print('ERR', e)")
    out = run_command([sys.executable, "-c", code], timeout=60)
    assert "ERR the MPI backend needs mpi4py" in out.stdout and "pip install mpi4py" in out.stdout, out.stderr


def _native_reference(rank, size):
    """test_torch_plugin's every-call check and torch DDP, over the native plugin."""
    from test_torch_plugin import _every_call, _torch_ddp
    return {"calls": _every_call(rank, size), "ddp": _torch_ddp(rank, size, 5)}


def test_torch_over_mpi_equals_the_native_path(tmp_path):
    """torch.distributed.init_process_group("pydist", init_method="mpi://",
    pg_options=pydist.torch.Options("mpi")): every torch call gives what the native plugin
    gives, and torch DDP trains to the same parameters (atol 1e-5)."""
    pytest.importorskip("torch")
    from pydist.testing import run_processes
    params_path = tmp_path / "params.npz"
    per_rank = run_ranks(2, [str(SCRIPTS / "mpi_torch.py"), "options", str(params_path)], tmp_path, timeout=120,
                         env={"PYDIST_BACKEND": "pydist"})
    native = run_processes(2, _native_reference, init="torch", timeout=120)
    for rank, (mine, reference) in enumerate(zip(per_rank, native)):
        assert mine.pop("engine") == "mpi"
        assert mine == json.loads(json.dumps(reference["calls"])), f"rank {rank}"
    with np.load(params_path) as saved:
        got = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    assert len(got) == len(native[0]["ddp"])
    for mine, reference in zip(got, native[0]["ddp"]):
        np.testing.assert_allclose(mine, reference, atol=1e-5)


def test_torch_env_switch_selects_mpi(tmp_path):
    """PYDIST_BACKEND=mpi: the default group and its new_groups run on MPI."""
    pytest.importorskip("torch")
    per_rank = run_ranks(3, [str(SCRIPTS / "mpi_torch.py"), "env"], tmp_path, timeout=120,
                         env={"PYDIST_BACKEND": "mpi"})
    for out in per_rank:
        assert out == {"all_reduce": [3.0, 3.0], "sub_engine": "mpi", "engine": "mpi"}
