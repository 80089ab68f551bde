"""Frameworks on the "pydist" backend against gloo (issue 41): each worker script beside this
file trains the same seeded model on 2 CPU ranks, once over gloo and once over pydist, under
the framework's own launcher; the parameters must be byte-identical (between the backends, and
between the ranks), the final losses equal, and DCP's shard files byte-identical. Each test
prints its side-by-side result (``-rP`` shows it).

The frameworks are pinned in pyproject's ``integration`` extra; ``make integration`` installs
them and runs this file. docs/guide/works-with.md describes what is covered here.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from pydist.testing.commands import finish, start_command

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parent
BACKENDS = ("gloo", "pydist")
WORLD_SIZE = 2
COMMAND_TIMEOUT = 600.0  # seconds; on a loaded 2-core machine a pair takes 20-120 s
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD_SIZE}"]


def needs(module: str) -> None:
    """Skip unless ``module`` is installed (found, not imported: the workers import it)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed: `make integration` installs pyproject's integration extra")


Results = dict[tuple[str, int], dict]  # a run's RESULT lines by (name, rank)


def results_of(stdout: str) -> Results:
    """The RESULT lines of a run by (name, rank): a launcher may prefix them, Ray repeats some."""
    found = (json.loads(line.split("RESULT ", 1)[1]) for line in stdout.splitlines() if "RESULT " in line)
    return {(result["name"], result["rank"]): result for result in found}


def run(argvs: dict[str, list[str]], env: dict[str, str] | None = None,
        exit_abort_allowed: str | None = None) -> dict[str, Results]:
    """Run each command (by label) concurrently; every one must exit 0, except that the command
    labelled ``exit_abort_allowed`` may die of torch's gloo exit abort (see gloo_exit_abort) once it
    has printed a RESULT line for every (name, rank) the others printed. The results of each."""
    environment = {**os.environ, **(env or {})}
    procs = [start_command(argv, env=environment, cwd=HERE) for argv in argvs.values()]
    done_of = dict(zip(argvs, finish(procs, COMMAND_TIMEOUT)))
    results = {label: results_of(done.stdout) for label, done in done_of.items()}
    for label, done in done_of.items():
        expected = set().union(*(found for other, found in results.items() if other != label))
        if label == exit_abort_allowed and gloo_exit_abort(done) and expected <= results[label].keys():
            print(f"\n{label} reported every result, then died of torch's gloo exit abort (see gloo_exit_abort)")
            continue
        assert done.returncode == 0, f"{label} exited {done.returncode}:\n{done.stdout}\n{done.stderr[-20000:]}"
    return results


def gloo_exit_abort(done: subprocess.CompletedProcess) -> bool:
    """Whether a gloo run failed only as torch 2.13's ProcessGroupGloo can at interpreter exit on
    a loaded machine: a gloo worker thread (``ProcessGroupGloo::runLoop``) drops the last reference
    to a finished ``AsyncAllgatherWork`` while the main thread is in ``Py_FinalizeEx``; the work's
    tensors need the GIL, which makes the thread exit inside a C++ destructor, and std::terminate
    aborts the process ("terminate called without an active exception"; the core's backtrace was
    read with gdb). It happens without pydist loaded (TORCH_DEVICE_BACKEND_AUTOLOAD=0): 2 runs of 5
    of deepspeed_zero.py over gloo beside one busy process. It is the reference's failure, not pydist's."""
    return done.returncode != 0 and "terminate called without an active exception" in done.stderr


def run_pair(argv: list[str], tmp_path: Path, env: dict[str, str] | None = None
             ) -> tuple[dict[str, Path], dict[str, Results]]:
    """Run ``argv`` once per backend, concurrently ("{backend}" and "{outdir}" filled in): the
    output directory of each (its ranks' parameter files) and the results of each."""
    outdirs = {backend: tmp_path / backend for backend in BACKENDS}
    for outdir in outdirs.values():
        outdir.mkdir()
    results = run({backend: [arg.format(backend=backend, outdir=outdirs[backend]) for arg in argv]
                   for backend in BACKENDS}, env, exit_abort_allowed="gloo")
    return outdirs, results


def compare(name_of: dict[str, str], outdir_of: dict[str, Path], results_of_backend: dict[str, Results]) -> None:
    """Assert that the backends' runs (by backend: the result name, the output directory, the
    results) agree bytewise, and print them side by side."""
    losses, params = {}, {}
    for backend in BACKENDS:
        name, results = name_of[backend], results_of_backend[backend]
        files = [(outdir_of[backend] / f"{name}-rank{rank}.bin").read_bytes() for rank in range(WORLD_SIZE)]
        assert all(data == files[0] for data in files), f"{name}: the ranks' parameters differ"
        losses[backend] = [results[name, rank]["loss"] for rank in range(WORLD_SIZE)]
        params[backend] = (files[0], results[name, 0]["sha256"])
    print(f"\n{name_of['pydist']}: final loss (rank 0, rank 1) gloo {losses['gloo']} pydist {losses['pydist']}; "
          f"parameters ({len(params['gloo'][0])} bytes) sha256 gloo {params['gloo'][1][:16]} "
          f"pydist {params['pydist'][1][:16]}")
    assert params["pydist"][0] == params["gloo"][0], f"{name_of['pydist']}: parameters differ from gloo's"
    assert losses["pydist"] == losses["gloo"]


def compare_pair(name: str, outdirs: dict[str, Path], results: dict[str, Results]) -> None:
    compare(dict.fromkeys(BACKENDS, name), outdirs, results)


@pytest.mark.parametrize("launch", ["ddp", "ddp_spawn"])
def test_lightning_trainer(launch, tmp_path):
    """``Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend=...))``,
    Lightning's own launcher (``ddp``: the script runs again as rank 1) and ``ddp_spawn``."""
    needs("lightning")
    outdirs, results = run_pair([sys.executable, "lightning_trainer.py", "{backend}", "{outdir}", launch], tmp_path)
    compare_pair(f"lightning-{launch}", outdirs, results)


def test_lightning_fabric(tmp_path):
    needs("lightning")
    outdirs, results = run_pair([sys.executable, "lightning_fabric.py", "{backend}", "{outdir}"], tmp_path)
    compare_pair("fabric", outdirs, results)


def test_dcp_save_load_under_torchrun(tmp_path):
    """DDP model + Adam saved and loaded with torch.distributed.checkpoint: the shard files are
    byte-identical to gloo's; the metadata file equal once unpickled, but for its storage_meta
    (the checkpoint's path and a random save id, which differ between any two saves)."""
    outdirs, results = run_pair([*TORCHRUN, "dcp_torchrun.py", "{backend}", "{outdir}"], tmp_path)
    compare_pair("dcp", outdirs, results)
    checkpoints = {backend: outdirs[backend] / "checkpoint" for backend in BACKENDS}
    shards = sorted(path.name for path in checkpoints["gloo"].glob("*.distcp"))
    assert shards == sorted(path.name for path in checkpoints["pydist"].glob("*.distcp")) and len(shards) == WORLD_SIZE
    for shard in shards:
        assert (checkpoints["pydist"] / shard).read_bytes() == (checkpoints["gloo"] / shard).read_bytes(), shard
    metadata = {}
    for backend, checkpoint in checkpoints.items():
        with open(checkpoint / ".metadata", "rb") as file:
            metadata[backend] = pickle.load(file)
        metadata[backend].storage_meta = None
    assert metadata["pydist"] == metadata["gloo"]
    print(f"dcp: shard files {shards} byte-identical to gloo's, metadata equal but for storage_meta")


def test_accelerate_with_group_made_first(tmp_path):
    """``init_process_group(backend)`` then ``Accelerator(cpu=True)``, under torchrun; the worker
    also records accelerate's refusal of ``InitProcessGroupKwargs(backend="pydist")`` and that
    without ``cpu=True`` (no GPU here) it runs as one process of one."""
    needs("accelerate")
    outdirs, results = run_pair([*TORCHRUN, "accelerate_torchrun.py", "{backend}", "{outdir}"], tmp_path)
    compare_pair("accelerate", outdirs, results)
    for backend in BACKENDS:
        for rank in range(WORLD_SIZE):
            result = results[backend]["accelerate", rank]
            assert result["group_backend"] == backend
            assert result["state_backend"] == "gloo"  # accelerate's record, whatever the group's backend
            assert result["processes_without_cpu_flag"] == 1
    refusals = {results["pydist"]["accelerate", rank]["refused"] for rank in range(WORLD_SIZE)}
    assert refusals == {"Your assigned backend pydist is not available, please use gloo"}
    print(f"accelerate: InitProcessGroupKwargs(backend='pydist') refused: {refusals.pop()!r}; "
          f"processes seen without cpu=True: 1 (gloo and pydist)")


def test_ray_train_torch_trainer(tmp_path):
    """``TorchTrainer(..., torch_config=TorchConfig(backend=...))`` on a local Ray cluster, 2
    workers, gloo then pydist; the workers know "pydist" only through torch's backend autoload."""
    needs("ray")
    results = run({"ray": [sys.executable, "ray_train.py", str(tmp_path)]})["ray"]
    for backend in BACKENDS:
        assert {results[f"ray-{backend}", rank]["group_backend"] for rank in range(WORLD_SIZE)} == {backend}
    compare({backend: f"ray-{backend}" for backend in BACKENDS}, dict.fromkeys(BACKENDS, tmp_path),
            dict.fromkeys(BACKENDS, results))


def test_deepspeed_zero_stages(tmp_path):
    """``deepspeed.init_distributed(dist_backend=...)`` on DeepSpeed's CPU accelerator, ZeRO
    stages 0 to 3, under torchrun."""
    needs("deepspeed")
    outdirs, results = run_pair([*TORCHRUN, "deepspeed_zero.py", "{backend}", "{outdir}"], tmp_path,
                                env={"DS_ACCELERATOR": "cpu"})
    for stage in range(4):
        compare_pair(f"deepspeed-zero{stage}", outdirs, results)


def test_submitit_local_executor(tmp_path):
    """submitit's LocalExecutor, 2 tasks: ``TorchDistributedEnvironment().export()`` then
    ``init_process_group(backend)`` with no URL, torch DDP."""
    needs("submitit")
    outdirs, results = run_pair([sys.executable, "submitit_local.py", "{backend}", "{outdir}"], tmp_path)
    for backend in BACKENDS:
        backends = {results[backend][f"submitit-{backend}", rank]["group_backend"] for rank in range(WORLD_SIZE)}
        assert backends == {backend}
    compare({backend: f"submitit-{backend}" for backend in BACKENDS}, outdirs, results)
