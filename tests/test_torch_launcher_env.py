"""``torch.distributed.init_process_group("pydist")`` with no URL under mpiexec, srun and
submitit's LocalExecutor: pydist.torch wraps torch's env:// handler so that the variables
torch needs come from the launcher's where they are missing (pydist.torch.env_rendezvous),
and leaves torch's handler alone where they are set. mpiexec is the venv's MPICH; srun and
submitit are simulated by their variables on two processes."""
from __future__ import annotations

import logging
import os
import re
import sys
import uuid

import pytest
from test_rendezvous_launch_env import (
    MPIEXEC,
    ROOT,
    _is_launch_variable,
    _mpich_shm,
    clean_env,
    results_of,
    run_all,
)

from pydist.rendezvous.launch_env import LAUNCHERS, job_port, launch_info

torch = pytest.importorskip("torch")
tdist = pytest.importorskip("torch.distributed")

from torch.distributed.rendezvous import rendezvous  # noqa: E402

from pydist.torch.env_rendezvous import fill_from_launcher, install, torch_handler  # noqa: E402

SCRIPT = str(ROOT / "tests" / "run_scripts" / "torch_launcher_env.py")
TORCH_NAMES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def env(monkeypatch):
    """os.environ without any launcher's variables (submitit's included); returns a setter."""
    for name in list(os.environ):
        if _is_launch_variable(name) or name.startswith("SUBMITIT_"):
            monkeypatch.delenv(name)

    def put(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)
    return put


def _once(name: str, text: str) -> int:
    """How often ``name`` occurs in ``text`` as a whole variable name (RANK is not in PMI_RANK)."""
    return len(re.findall(rf"(?<![A-Z_]){name}(?![A-Z_])", text))


def check(results: dict[int, dict], n: int, addr: str, port: int) -> None:
    assert sorted(results) == list(range(n))
    for rank, r in results.items():
        assert (r["size"], r["sum"], r["backend"]) == (n, [n * (n + 1) / 2, n], "pydist"), r
        assert all(r["before"][name] is None for name in TORCH_NAMES), r
        assert r["after"] == {"RANK": str(rank), "WORLD_SIZE": str(n), "MASTER_ADDR": addr, "MASTER_PORT": str(port),
                              "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(n)}, r


# --- the wrapper (no processes) ------------------------------------------------------------------

def test_the_env_handler_is_wrapped_once():
    install()
    from torch.distributed.rendezvous import _env_rendezvous_handler, _rendezvous_handlers

    assert torch_handler() is _env_rendezvous_handler
    wrapper = _rendezvous_handlers["env"]
    assert wrapper is not _env_rendezvous_handler
    install()
    assert _rendezvous_handlers["env"] is wrapper


def test_torchs_variables_set_leave_torchs_handler_alone():
    """torchrun's variables win over any launcher's, and nothing is read or written."""
    environ = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
               "SLURM_PROCID": "5", "SLURM_NTASKS": "8", "PMI_RANK": "3", "PMI_SIZE": "4"}
    copy = dict(environ)
    assert fill_from_launcher("env://", copy) == {} and copy == environ
    partial = {"MASTER_ADDR": "h", "MASTER_PORT": "1234", "PMI_RANK": "1", "PMI_SIZE": "2"}
    assert fill_from_launcher("env://?rank=1&world_size=2", partial) == {}


def test_only_the_missing_variables_are_filled():
    environ = {"MASTER_ADDR": "head", "WORLD_SIZE": "4", "PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1",
               "MPI_LOCALNRANKS": "2", "PMI_KVSNAME": "kvs_1"}
    filled = fill_from_launcher("env://", environ)
    assert filled == {"RANK": "3", "MASTER_PORT": str(job_port("PMI_KVSNAME=kvs_1")), "LOCAL_RANK": "1",
                      "LOCAL_WORLD_SIZE": "2"}
    assert environ["MASTER_ADDR"] == "head" and environ["RANK"] == "3"


def test_the_url_rank_and_world_size_count_as_given():
    environ = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
               "OMPI_MCA_ess_base_jobid": "77", "LOCAL_RANK": "0"}
    filled = fill_from_launcher("env://?rank=1&world_size=2", environ)
    assert filled == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(job_port("OMPI_MCA_ess_base_jobid=77")),
                      "LOCAL_WORLD_SIZE": "2"}


def test_without_a_launcher_torchs_own_error_stands(env):
    with pytest.raises(ValueError, match="environment variable RANK expected, but not set"):
        next(rendezvous("env://"))
    assert "RANK" not in os.environ


def test_a_launcher_that_cannot_give_the_address_says_why_naming_each_variable_once(env):
    env(PMI_RANK="0", PMI_SIZE="4", MPI_LOCALRANKID="0", MPI_LOCALNRANKS="2")  # 2 hosts, no job id
    with pytest.raises(ValueError) as error:
        tdist.init_process_group("pydist")
    message = str(error.value)
    assert message.startswith("Error initializing torch.distributed using env:// rendezvous: "), message
    assert "mpiexec (MPICH Hydra)" in message and "set it to the host of rank 0" in message, message
    assert "PMI_KVSNAME" in message
    assert all(_once(name, message) == 1 for name in ("MASTER_ADDR", "MASTER_PORT")), message
    assert not tdist.is_initialized() and "RANK" not in os.environ


@pytest.fixture
def filled_back(monkeypatch):
    """Takes back at the end what a rendezvous set in os.environ behind monkeypatch's back."""
    names = (*TORCH_NAMES, "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    yield
    if tdist.is_initialized():
        tdist.destroy_process_group()
    for name in names:
        os.environ.pop(name, None)


MPIEXEC_ONE_RANK = {"PMI_RANK": "0", "PMI_SIZE": "1", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1",
                    "PMI_KVSNAME": "kvs_one"}


def test_another_backend_under_a_launcher_gets_torchs_own_error(env, filled_back):
    """gloo under mpiexec without torch's variables: torch's error, not a port of pydist's."""
    env(**MPIEXEC_ONE_RANK)
    with pytest.raises(ValueError, match="env:// rendezvous: environment variable RANK expected, but not set"):
        tdist.init_process_group("gloo")
    assert not tdist.is_initialized() and all(name not in os.environ for name in TORCH_NAMES)


def test_the_pydist_backend_under_a_launcher_gets_them_and_the_log_names_them(env, filled_back, caplog):
    env(**MPIEXEC_ONE_RANK)
    with caplog.at_level(logging.INFO, logger="pydist"):
        tdist.init_process_group("cpu:pydist")
    port = job_port("PMI_KVSNAME=kvs_one")
    assert (tdist.get_rank(), tdist.get_world_size(), os.environ["MASTER_PORT"]) == (0, 1, str(port))
    filled = [r.getMessage() for r in caplog.records if "env://" in r.getMessage()]
    assert len(filled) == 1 and "mpiexec (MPICH Hydra)" in filled[0], filled
    assert all(f"{name}=" in filled[0] for name in TORCH_NAMES), filled


def test_the_missing_variables_error_names_each_variable_once(env):
    with pytest.raises(ValueError) as error:
        launch_info()
    message = str(error.value)
    names = [*TORCH_NAMES, *(launcher.rank for launcher in LAUNCHERS)]
    assert {name: _once(name, message) for name in names} == dict.fromkeys(names, 1), message


# --- the launchers ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec next to the interpreter")
def test_mpiexec_torch_init_without_url():
    """MPICH's Hydra: rank and size from PMI_RANK/PMI_SIZE, 127.0.0.1, the port of Hydra's proxy pid."""
    shm_before = _mpich_shm()
    try:
        outputs = run_all([([str(MPIEXEC), "-n", "2", sys.executable, SCRIPT], clean_env())])
    finally:
        new_shm = _mpich_shm() - shm_before
        for name in new_shm:
            os.unlink(f"/dev/shm/{name}")
    results = results_of(outputs)
    port = int(results[0]["after"]["MASTER_PORT"])
    check(results, 2, "127.0.0.1", port)
    assert new_shm == set()


@pytest.mark.slow
def test_simulated_srun_torch_init_without_url():
    job = str(uuid.uuid4().int % 10**9)
    n = 2
    commands = [([sys.executable, SCRIPT], clean_env(
        SLURM_PROCID=str(r), SLURM_NTASKS=str(n), SLURM_LOCALID=str(r), SLURM_NODEID="0",
        SLURM_TASKS_PER_NODE=str(n), SLURM_JOB_NODELIST="localhost", SLURM_JOB_ID=job, SLURM_STEP_ID="0"))
        for r in range(n)]
    check(results_of(run_all(commands)), n, "localhost", job_port(f"SLURM_JOB_ID={job};SLURM_STEP_ID=0"))


@pytest.mark.slow
def test_simulated_submitit_local_executor_torch_init_without_url():
    """submitit's LocalExecutor: SUBMITIT_LOCAL_GLOBALID/LOCALID/NTASKS/JOB_ID (its controller's
    pid), one host; started inside a Slurm allocation, its variables win over the batch step's."""
    job = str(uuid.uuid4().int % 10**9)
    n = 2
    commands = [([sys.executable, SCRIPT], clean_env(
        SUBMITIT_EXECUTOR="local", SUBMITIT_LOCAL_GLOBALID=str(r), SUBMITIT_LOCAL_LOCALID=str(r),
        SUBMITIT_LOCAL_NTASKS=str(n), SUBMITIT_LOCAL_NODEID="0", SUBMITIT_LOCAL_JOB_NUM_NODES="1",
        SUBMITIT_LOCAL_JOB_ID=job, SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_JOB_ID="1"))
        for r in range(n)]
    check(results_of(run_all(commands)), n, "127.0.0.1", job_port(f"SUBMITIT_LOCAL_JOB_ID={job}"))
