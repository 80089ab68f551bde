"""init_process_group() with no arguments under other launchers: what is read from the
environment (pydist.rendezvous.launch_env), the agent store's per-attempt namespace, and real runs
under mpiexec, torchrun, pydist-run and a simulated srun."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from pydist import DistStoreError
from pydist.core.settings import settings
from pydist.rendezvous import OwningPrefixStore, TorchStore, rendezvous
from pydist.rendezvous.launch_env import LaunchInfo, job_port, launch_info, parse_hostlist, parse_tasks_per_node
from pydist.store import PrefixStore, TCPStore
from pydist.store._base import StoreTimeoutError
from pydist.testing.commands import finish, start_command
from pydist.transport.identity import advertise_address

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "tests" / "run_scripts" / "launch_env_allreduce.py")
MPIEXEC = Path(sys.executable).parent / "mpiexec"
RUN_TIMEOUT = 90.0
#: Variables a launcher sets; removed from the children's environment and the monkeypatched one.
LAUNCH_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "SLURM_", "MPI_LOCAL", "TORCHELASTIC_", "HYDI_", "PALS_")
LAUNCH_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "GROUP_RANK", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING")


def _is_launch_variable(name: str) -> bool:
    return name in LAUNCH_NAMES or name.startswith(LAUNCH_PREFIXES)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any launcher's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not _is_launch_variable(k)}
    return {**env, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **extra}


@pytest.fixture
def env(monkeypatch):
    """A clean os.environ; returns a setter of variables."""
    for name in list(os.environ):
        if _is_launch_variable(name):
            monkeypatch.delenv(name)

    def put(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)
    return put


# --- Slurm hostlists -----------------------------------------------------------------------

@pytest.mark.parametrize("text, hosts", [
    ("node[01-04,07],gpu-a[1-2],login1",
     ["node01", "node02", "node03", "node04", "node07", "gpu-a1", "gpu-a2", "login1"]),
    ("n[009-011]", ["n009", "n010", "n011"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[098-100]", ["n098", "n099", "n100"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("node[3]-ib", ["node3-ib"]),
    ("login1", ["login1"]),
    ("a, b[1-2]", ["a", "b1", "b2"]),
])
def test_parse_hostlist(text, hosts):
    assert parse_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["", "n[1-2", "n]1[", "n[a-b]", "n[3-1]", "n[[1-2]]", "a,,b", "n[1-]", "n[]"])
def test_parse_hostlist_rejects(text):
    with pytest.raises(ValueError, match="hostlist"):
        parse_hostlist(text)


def test_parse_tasks_per_node():
    assert parse_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert parse_tasks_per_node("4") == [4]
    with pytest.raises(ValueError, match="tasks per node"):
        parse_tasks_per_node("2(3)")


def test_job_port_is_deterministic_and_below_the_ephemeral_ports():
    """Derived ports stay under 32768, where Linux's ephemeral ports (outgoing connections,
    port-0 listeners) begin: one of those on rank 0's host took a derived port in a CI run
    ("Address already in use"). 2,000 job ids spread evenly over the 12,768 ports would give
    ~1,851 distinct ones."""
    ports = {job_port(f"SLURM_JOB_ID={n}") for n in range(2000)}
    assert all(20000 <= p < 32768 for p in ports) and len(ports) > 1800
    assert job_port("PMI_KVSNAME=kvs_1") == job_port("PMI_KVSNAME=kvs_1")


# --- detection (monkeypatched environment) -------------------------------------------------

def test_torchrun_variables(env):
    env(RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", MASTER_ADDR="h", MASTER_PORT="1234",
        TORCHELASTIC_RUN_ID="x")
    assert launch_info() == LaunchInfo("torchrun", 3, 4, 1, 2, "h", 1234)


def test_plain_env_without_local_variables(env):
    env(RANK="0", WORLD_SIZE="1", MASTER_ADDR="h", MASTER_PORT="1")
    assert launch_info() == LaunchInfo("env", 0, 1, None, None, "h", 1)


def test_openmpi(env):
    env(OMPI_COMM_WORLD_RANK="2", OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_LOCAL_RANK="2",
        OMPI_COMM_WORLD_LOCAL_SIZE="4", OMPI_MCA_ess_base_jobid="123", PMIX_RANK="2")
    assert launch_info() == LaunchInfo("openmpi", 2, 4, 2, 4, "127.0.0.1", job_port("OMPI_MCA_ess_base_jobid=123"))
    os.environ.pop("OMPI_MCA_ess_base_jobid")
    env(PMIX_NAMESPACE="prterun-vm-77@1")  # Open MPI 5
    assert launch_info().master_port == job_port("PMIX_NAMESPACE=prterun-vm-77@1")


def test_mpich_hydra_on_one_host(env):
    """Hydra exports no job id on one host: the port comes from its proxy's pid (here the
    test's parent, whose environment has no PMI_RANK)."""
    env(PMI_RANK="1", PMI_SIZE="2", MPI_LOCALRANKID="1", MPI_LOCALNRANKS="2", PMI_FD="9")
    info = launch_info()
    assert info == LaunchInfo("mpich", 1, 2, 1, 2, "127.0.0.1", job_port(f"mpich-pid={os.getppid()}"))
    env(PMI_KVSNAME="kvs_42_0")
    assert launch_info().master_port == job_port("PMI_KVSNAME=kvs_42_0")


def test_mpich_on_several_hosts_needs_master_addr(env):
    env(PMI_RANK="0", PMI_SIZE="4", MPI_LOCALRANKID="0", MPI_LOCALNRANKS="2")
    with pytest.raises(ValueError, match="MASTER_ADDR") as error:
        launch_info()
    assert "MASTER_PORT" in str(error.value) and "PMI_KVSNAME" in str(error.value)
    env(MASTER_ADDR="head", PMI_PORT="head:4000")
    assert launch_info() == LaunchInfo("mpich", 0, 4, 0, 2, "head", job_port("PMI_PORT=head:4000"))


def test_slurm(env):
    env(SLURM_PROCID="3", SLURM_NTASKS="6", SLURM_LOCALID="1", SLURM_NODEID="1", SLURM_TASKS_PER_NODE="2(x2),2",
        SLURM_JOB_NODELIST="gpu[07-09]", SLURM_JOB_ID="4242", SLURM_STEP_ID="0")
    port = job_port("SLURM_JOB_ID=4242;SLURM_STEP_ID=0")
    assert launch_info() == LaunchInfo("slurm", 3, 6, 1, 2, "gpu07", port)
    env(SLURM_STEP_NODELIST="gpu[08-09]", SLURM_STEP_ID="1", SLURM_STEP_TASKS_PER_NODE="3(x2)")
    assert launch_info() == LaunchInfo("slurm", 3, 6, 1, 3, "gpu08", job_port("SLURM_JOB_ID=4242;SLURM_STEP_ID=1"))


def test_slurm_ntasks_per_node_and_missing_job_id(env):
    env(SLURM_PROCID="0", SLURM_NTASKS="2", SLURM_LOCALID="0", SLURM_NTASKS_PER_NODE="2", SLURM_NODELIST="n1")
    with pytest.raises(ValueError, match="MASTER_PORT .*SLURM_JOB_ID"):
        launch_info()
    env(SLURM_JOBID="7")
    assert launch_info() == LaunchInfo("slurm", 0, 2, 0, 2, "n1", job_port("SLURM_JOBID=7"))


def test_precedence_arguments_then_generic_then_launcher(env):
    env(SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_JOB_NODELIST="n[1-2]", SLURM_JOB_ID="9")
    assert (launch_info().rank, launch_info().world_size) == (1, 2)
    env(RANK="5", WORLD_SIZE="8", MASTER_ADDR="10.0.0.1", MASTER_PORT="29500")
    info = launch_info()
    assert (info.launcher, info.rank, info.world_size, info.master_addr, info.master_port) == \
        ("slurm", 5, 8, "10.0.0.1", 29500)
    assert (launch_info(rank=6, world_size=7).rank, launch_info(rank=6, world_size=7).world_size) == (6, 7)


def test_mpiexec_inside_sbatch_wins_over_the_batch_steps_slurm_variables(env):
    env(SLURM_PROCID="0", SLURM_NTASKS="4", SLURM_JOB_NODELIST="n1", SLURM_JOB_ID="1",
        PMI_RANK="3", PMI_SIZE="4", MPI_LOCALRANKID="3", MPI_LOCALNRANKS="4")
    info = launch_info()
    assert (info.launcher, info.rank, info.master_addr) == ("mpich", 3, "127.0.0.1")


def test_pmix_alone_needs_world_size(env):
    env(PMIX_RANK="1", PMIX_NAMESPACE="ns", MASTER_ADDR="h")
    with pytest.raises(ValueError, match="WORLD_SIZE \\(a PMIx launcher exports no"):
        launch_info()
    assert launch_info(world_size=2) == LaunchInfo("pmix", 1, 2, None, None, "h", job_port("PMIX_NAMESPACE=ns"))


def test_missing_names_every_variable(env):
    with pytest.raises(ValueError) as error:
        launch_info()
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PMI_RANK", "SLURM_PROCID"):
        assert name in str(error.value)
    env(PMI_RANK="0")
    with pytest.raises(ValueError, match="WORLD_SIZE .*PMI_RANK but not PMI_SIZE"):
        launch_info()


@pytest.mark.parametrize("name, value", [("PMI_SIZE", "two"), ("SLURM_NODEID", "x"), ("MASTER_PORT", "70000")])
def test_not_a_number_names_the_variable(env, name, value):
    env(PMI_RANK="0", PMI_SIZE="1", MPI_LOCALNRANKS="1", PMI_KVSNAME="k")
    env(SLURM_TASKS_PER_NODE="1", **{name: value})
    if name == "SLURM_NODEID":  # read only for Slurm
        env(SLURM_PROCID="0", SLURM_NTASKS="1", PMI_RANK="")
    with pytest.raises(ValueError, match=name):
        launch_info()


# --- the agent store: one namespace per restart attempt -------------------------------------

def test_agent_store_is_prefixed_by_attempt_and_owned(env):
    agent = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=5))
    try:
        env(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(agent.port),
            TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="3")
        store, rank, size = rendezvous("env://", -1, -1, timedelta(seconds=5))
        assert isinstance(store, OwningPrefixStore) and (rank, size) == (0, 1)
        store.set("k", b"v")
        assert agent.get("/worker/attempt_3/k") == b"v" and store.list_keys() == ["k"]
        assert advertise_address(PrefixStore("pydist/1", store), settings()) == "127.0.0.1"
        client = store.underlying_store
        store.close()
        with pytest.raises(DistStoreError):  # pydist's TCPStore client: "<host:port> is closed"
            client.set("x", b"1")  # closed with the OwningPrefixStore
    finally:
        agent.close()


def test_torch_store_adapter():
    torch_dist = pytest.importorskip("torch.distributed")
    store = PrefixStore("p", TorchStore(torch_dist.HashStore(), timedelta(seconds=120)))
    store.set("a", b"1")
    assert store.get("a") == b"1" and store.add("n", 2) == 2 and store.multi_get(["a", "n"]) == [b"1", b"2"]
    assert store.compare_set("a", b"1", b"3") == b"3" and store.check(["a"]) and not store.check(["zz"])
    assert store.delete_key("a") is True
    start = time.monotonic()
    with pytest.raises(StoreTimeoutError, match="zz") as error:
        store.wait(["zz"], timedelta(seconds=0.2))
    # 0.2 s timeout: the bound only catches a wait that ignores it (the store's own timeout is
    # 120 s), generous for a loaded machine
    assert error.value.keys == ["p/zz"] and 0.19 <= time.monotonic() - start < 30
    store.close()


# --- real runs -----------------------------------------------------------------------------

def _session_pids(sid: int) -> list[int]:
    """Live processes of session ``sid``."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.isdigit() and fields[0] != b"Z" and int(fields[3]) == sid:
            pids.append(int(entry))
    return pids


Outputs = list[tuple[int, str, str]]


def run_all(commands: list[tuple[list[str], dict[str, str]]], timeout: float = RUN_TIMEOUT) -> Outputs:
    """Run every (argv, env) at once, each in a session of its own, and return (returncode,
    stdout, stderr) of each. On timeout every session is killed; either way no process of
    theirs is left when this returns."""
    procs = [start_command(argv, env=env, cwd=ROOT) for argv, env in commands]
    try:
        done = finish(procs, timeout)
    finally:
        for proc in procs:
            _kill_session(proc)
    return [(c.returncode, c.stdout, c.stderr) for c in done]


def _kill_session(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    end = time.monotonic() + 5
    while _session_pids(proc.pid) and time.monotonic() < end:
        time.sleep(0.05)
    for pid in _session_pids(proc.pid):
        os.kill(pid, signal.SIGKILL)


def results_of(outputs: Outputs) -> dict[int, dict]:
    """Every rank's RESULT line, by rank, after checking that every command succeeded."""
    for code, out, err in outputs:
        assert code == 0, out + err
    found = [json.loads(line.split("RESULT ", 1)[1]) for _, out, _ in outputs
             for line in out.splitlines() if "RESULT " in line]
    return {r["rank"]: r for r in found}


def check_allreduce(results: dict[int, dict], n: int, launcher: str) -> None:
    assert sorted(results) == list(range(n))
    total = n * (n + 1) / 2
    for _rank, r in results.items():
        assert (r["size"], r["sum"], r["launcher"]) == (n, [total, n], launcher), r
    assert len({r["port"] for r in results.values()}) == 1


def _mpich_shm() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("mpich")}


@pytest.mark.slow
@pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec next to the interpreter")
@pytest.mark.parametrize("n", [2, 3])
def test_mpiexec_no_argument_init(n):
    """Hydra's ranks (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS) meet on
    127.0.0.1 at the port derived from the proxy's pid. Hydra leaves nothing in /dev/shm
    when the program does not initialise MPI; anything new named mpich* is removed."""
    shm_before = _mpich_shm()
    try:
        results = results_of(run_all([([str(MPIEXEC), "-n", str(n), sys.executable, SCRIPT], clean_env())]))
    finally:
        new_shm = _mpich_shm() - shm_before
        for name in new_shm:
            os.unlink(f"/dev/shm/{name}")
    check_allreduce(results, n, "mpich")
    assert all((r["local_rank"], r["local_world_size"], r["addr"]) == (rank, n, "127.0.0.1")
               for rank, r in results.items())
    assert new_shm == set()


@pytest.mark.slow
def test_torchrun_no_argument_init():
    """torchrun's agent hosts torch's C++ TCPStore; pydist reaches it through torch's client."""
    pytest.importorskip("torch")
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", SCRIPT]
    results = results_of(run_all([(argv, clean_env())]))
    check_allreduce(results, 2, "torchrun")
    assert all(r["local_rank"] == rank and r["local_world_size"] == 2 for rank, r in results.items())


@pytest.mark.slow
@pytest.mark.parametrize("torch_client", [False, True])
def test_pydist_run_no_argument_init(torch_client):
    """pydist-run's agent store; with a torchrun marker variable set, pydist talks to it
    through torch's client, which pydist's store server also serves."""
    if torch_client:
        pytest.importorskip("torch")
    extra = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"} if torch_client else {}
    results = results_of(run_all([([sys.executable, "-m", "pydist.run", "--nproc-per-node", "2", SCRIPT],
                                   clean_env(**extra))]))
    check_allreduce(results, 2, "torchrun")


@pytest.mark.slow
def test_simulated_srun_no_argument_init():
    """srun's variables only (no srun here): rank 0's host is the first of the node list,
    the port comes from the job and step ids."""
    n, job = 3, str(uuid.uuid4().int % 10**7)
    commands = [([sys.executable, SCRIPT], clean_env(
        SLURM_PROCID=str(r), SLURM_NTASKS=str(n), SLURM_LOCALID=str(r), SLURM_NODEID="0",
        SLURM_TASKS_PER_NODE=f"{n},2(x2)", SLURM_JOB_NODELIST="localhost,node[02-03]", SLURM_JOB_ID=job,
        SLURM_STEP_ID="0")) for r in range(n)]
    results = results_of(run_all(commands))
    check_allreduce(results, n, "slurm")
    assert {r["port"] for r in results.values()} == {job_port(f"SLURM_JOB_ID={job};SLURM_STEP_ID=0")}
    assert all((r["local_rank"], r["local_world_size"], r["addr"]) == (rank, n, "localhost")
               for rank, r in results.items())


@pytest.mark.slow
def test_restarted_attempt_reuses_the_agent_store():
    """Two attempts against one agent store (as after an elastic restart): the second does
    not see the first one's keys (rank addresses of dead processes), so it meets afresh."""
    agent = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
    try:
        for attempt in range(2):
            commands = [([sys.executable, SCRIPT], clean_env(
                RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(agent.port), TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RUN_ID="job",
                TORCHELASTIC_RESTART_COUNT=str(attempt))) for r in range(2)]
            check_allreduce(results_of(run_all(commands)), 2, "torchrun")
        prefixes = {tuple(key.split("/")[1:4]) for key in agent.list_keys() if key.startswith("attempt/")}
        assert prefixes == {("job", "0", "2"), ("job", "1", "2")}  # run id, restart count, world size
    finally:
        agent.close()
