"""The examples run as the README says: the collectives tour and the training demo
(which snapshots and resumes)."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pydist.testing.commands import run_command

pytestmark = pytest.mark.slow  # the examples run under pydist-run

ROOT = Path(__file__).resolve().parent.parent
RUN = [sys.executable, "-m", "pydist.run"]


def launch(*args: str, cwd: Path = ROOT, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return run_command(RUN + list(args), cwd=cwd, timeout=timeout, env=env)


def test_collectives_tour_on_four_ranks():
    done = launch("--nproc-per-node", "4", "-m", "pydist.examples.collectives")
    assert done.returncode == 0, done.stderr
    for rank in range(4):
        lines = [line for line in done.stdout.splitlines() if line.startswith(f"[rank{rank}]:")]
        assert any("all_reduce SUM         [16, 20]" in line for line in lines), lines
        token = 4.0 if rank == 0 else rank + 1.0  # each rank adds one as the token goes round
        assert any(f"send/recv ring token   [{token}]" in line for line in lines), lines


def test_training_demo_learns_snapshots_and_resumes(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    snapshot = str(tmp_path / "snap.pt")
    first = launch("--nproc-per-node", "2", "-m", "pydist.examples.train", "--epochs", "3",
                   "--snapshot", snapshot)
    assert first.returncode == 0, first.stderr
    accuracies = [float(a) for a in re.findall(r"held-out accuracy ([\d.]+) %", first.stdout)]
    assert len(accuracies) == 3 and accuracies[-1] >= 90.0, first.stdout
    assert re.search(r"\[rank0\]:\d+ steps, .* communication: [\d.]+ MB reduced", first.stdout), first.stdout
    second = launch("--nproc-per-node", "2", "-m", "pydist.examples.train", "--epochs", "4",
                    "--snapshot", snapshot)
    assert second.returncode == 0, second.stderr
    assert "resuming from" in second.stdout and "after epoch 3" in second.stdout
    assert re.findall(r"epoch +(\d+)/4", second.stdout) == ["4"], second.stdout


FAULT_TOLERANT = ["--nproc-per-node", "4", "--on-failure", "continue", "-m", "pydist.examples.train",
                  "--fault-tolerant", "--epochs", "3"]
FINAL_ACCURACY = r"finished on \d ranks .*: held-out accuracy ([\d.]+) %"


@pytest.fixture(scope="module")
def accuracy_without_failure() -> float:
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    whole = launch(*FAULT_TOLERANT)
    assert whole.returncode == 0, whole.stderr
    return float(re.findall(FINAL_ACCURACY, whole.stdout)[0])


@pytest.mark.parametrize("victim", [2, 0])
def test_fault_tolerant_training_loses_a_worker_and_learns_as_without(victim, accuracy_without_failure):
    """4 workers, one killed at step 20 (rank 0 too: the store's host): the others shrink,
    take rank 0's state, and end with the accuracy of the same run without a failure, within
    a point (the same global batches; only the gradients' summation order differs)."""
    killed = launch(*FAULT_TOLERANT, "--kill-rank", str(victim), "--kill-step", "20")
    assert killed.returncode == 0, killed.stderr
    assert f"rank {victim} (pid" in killed.stderr and "failed with signal SIGKILL" in killed.stderr
    survivors = [r for r in range(4) if r != victim]
    assert re.search(rf"lost launch rank\(s\) \[{victim}\] at step 20 \(\w+\); recovered in \d+ ms on 3 ranks "
                     rf"{re.escape(str(survivors))}", killed.stdout), killed.stdout
    accuracy = float(re.findall(FINAL_ACCURACY, killed.stdout)[0])
    assert abs(accuracy - accuracy_without_failure) <= 1.0 and accuracy_without_failure >= 90.0, killed.stdout


def test_torch_tutorial_script_runs_under_pydist_run(tmp_path):
    """A torchrun-style script (torch's DDP, DistributedSampler, snapshot on rank 0) with
    only the backend name changed: torch's env:// rendezvous reaches the launcher's store,
    and a second run resumes from the snapshot."""
    pytest.importorskip("torch")
    script = str(ROOT / "tests" / "ddp_programs" / "ddp_torchrun_style.py")
    snapshot = str(tmp_path / "snapshot.pt")
    first = launch("--nproc-per-node", "2", script, "4", "2", "--snapshot", snapshot, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    for rank in range(2):
        losses = [float(x) for x in re.findall(rf"\[rank{rank}\] epoch \d \| steps 8 \| loss ([\d.]+)", first.stdout)]
        assert len(losses) == 4 and losses[-1] < losses[0] / 10, first.stdout
    assert first.stdout.count("Training snapshot saved") == 2, first.stdout
    second = launch("--nproc-per-node", "2", script, "6", "2", "--snapshot", snapshot, cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert second.stdout.count("Resuming training from snapshot at Epoch 4") == 2, second.stdout
    assert re.findall(r"\[rank0\] epoch (\d)", second.stdout) == ["4", "5"], second.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_torch_suite_runs_torch_suite_in_the_test_venv():
    """`make torch-suite` installs the test extras (pytest, expecttest) before running torch's
    suite against the plugin, so it works after `make demo` (whose venv has no pytest)."""
    # PYTEST_ARGS= on the command line: under `make test PYTEST_ARGS=...` (CI) the sub-make
    # inherits the caller's value through MAKEFLAGS.
    done = run_command(["make", "-n", "-B", "torch-suite", "PYTEST_ARGS="], cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    install = next(i for i, line in enumerate(lines) if "'.[test," in line and "expecttest" in line)
    suite = lines.index("BACKEND=pydist WORLD_SIZE=2 .venv/bin/python -m pytest "
                        "tests/torch_suite/torch_distributed_suite.py -q ")
    assert install < suite
