"""pydist-run (the launcher) end to end: real launcher processes running real workers.

Workers are ``tests/run_scripts/worker.py``; each records its pid in a per-test directory and
the ``pids`` fixture SIGKILLs, by pid, anything of ours still running after the test.
"""
from __future__ import annotations

import collections
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pydist.run import cli, output
from pydist.run.agent import Agent
from pydist.run.config import LaunchConfig, Placement, worker_command, worker_env
from pydist.testing.commands import finish, kill_group, run_command, start_command

SCRIPTS = Path(__file__).parent / "run_scripts"
WORKER = str(SCRIPTS / "worker.py")
LAUNCHER = [sys.executable, "-m", "pydist.run"]
#: Seconds within which a job whose other workers sleep 60 s (worker.py) must end when they are
#: stopped rather than waited for: far below the sleep, far above what a loaded machine adds.
STOPPED_NOT_AWAITED = 40.0


def is_running(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (orphans are reaped by init lazily)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.fixture
def pids(tmp_path: Path):
    """A directory the workers write their pids to; leftovers are killed at teardown."""
    piddir = tmp_path / "pids"
    piddir.mkdir()
    started: list[subprocess.Popen] = []
    yield piddir, started
    for proc in started:
        if proc.poll() is None:
            kill_group(proc)
            proc.wait()
    leftovers = [int(p.read_text()) for p in piddir.iterdir() if p.read_text()]
    for pid in leftovers:
        if is_running(pid):
            os.kill(pid, signal.SIGKILL)
    assert not [pid for pid in leftovers if is_running(pid)]


def env_for(piddir: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PIDDIR=str(piddir), PYTHONPATH=os.pathsep.join([str(SCRIPTS), *sys.path]))
    env.pop("OMP_NUM_THREADS", None)
    env.update(extra)
    return env


def run(args: list[str], piddir: Path, timeout: float = 30, launcher: list[str] = LAUNCHER, **extra: str):
    """Run the launcher to completion; return (CompletedProcess, seconds)."""
    start = time.monotonic()
    result = run_command([*launcher, *args], env=env_for(piddir, **extra), timeout=timeout)
    return result, time.monotonic() - start


def tagged(stdout: str, tag: str) -> dict[int, object]:
    """``{rank: json}`` from launcher lines ``[rankR]:TAG json``."""
    found: dict[int, object] = {}
    for line in stdout.splitlines():
        head, _, body = line.partition("]:")
        if body.startswith(tag + " "):
            found[int(head.removeprefix("[rank"))] = json.loads(body[len(tag) + 1:])
    return found


def wait_for_files(piddir: Path, names: set[str], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if names <= {p.name for p in piddir.iterdir() if p.read_text()}:
            return
        time.sleep(0.05)
    raise AssertionError(f"workers did not start: {names}")


def all_pids(piddir: Path) -> list[int]:
    return [int(p.read_text()) for p in piddir.iterdir()]


# --- worker environment and command line (no processes) ---------------------------------------

def test_worker_env_is_torchruns():
    config = LaunchConfig(nproc_per_node=4, command=["x"], run_id="job", base_env={"PATH": "/bin"})
    env = worker_env(config, Placement(master_port=1234), 3)
    assert env == {
        "PATH": "/bin", "RANK": "3", "LOCAL_RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4",
        "ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234",
        "TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "True", "OMP_NUM_THREADS": "1", "PYDIST_RUN_WORKER": "1",
    }
    assert worker_env(config, Placement(), 0, auth_token="s3cret")["PYDIST_AUTH_TOKEN"] == "s3cret"
    assert "OMP_NUM_THREADS" not in worker_env(LaunchConfig(1, ["x"], base_env={}), Placement(), 0)
    assert worker_env(LaunchConfig(2, ["x"], base_env={"OMP_NUM_THREADS": "7"}), Placement(),
                      0)["OMP_NUM_THREADS"] == "7"


def test_worker_command():
    assert worker_command("a.py", ["--x"]) == [sys.executable, "-u", "a.py", "--x"]
    assert worker_command("mod", ["1"], module=True) == [sys.executable, "-u", "-m", "mod", "1"]
    assert worker_command("/bin/sh", ["-c", "true"], no_python=True) == ["/bin/sh", "-c", "true"]
    with pytest.raises(ValueError):
        worker_command("mod", [], module=True, no_python=True)


def test_parse_spellings_and_passthrough(monkeypatch):
    monkeypatch.delenv("PET_NPROC_PER_NODE", raising=False)
    args = cli.build_parser().parse_args(
        ["--nproc_per_node", "3", "--master-addr", "localhost", "s.py", "--nproc-per-node", "9", "-m"]
    )
    config = cli.config_from_args(args)
    assert config.nproc_per_node == 3 and config.master_addr == "localhost"
    assert config.command[-4:] == ["s.py", "--nproc-per-node", "9", "-m"]
    abbreviated = cli.build_parser().parse_args(["-m", "pydist.bench", "--nproc", "2"])  # no prefix matching
    assert abbreviated.training_script_args == ["--nproc", "2"]
    assert cli.nproc_from("cpu") == cli.nproc_from("auto") == (os.cpu_count() or 1)
    assert len(config.run_id) > 8
    for bad in ("0", "gpu", "x"):
        with pytest.raises(ValueError):
            cli.nproc_from(bad)
    monkeypatch.setenv("PET_NPROC_PER_NODE", "5")
    assert cli.config_from_args(cli.build_parser().parse_args(["s.py"])).nproc_per_node == 5


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--bogus", "s.py"], "unrecognized arguments"),
        (["-m", "--no-python", "s.py"], "not allowed with"),
        (["--nnodes", "1:2", "s.py"], "needs --rdzv-backend c10d"),
        (["--rdzv-conf", "bogus=1", "s.py"], "--rdzv-conf"),
        (["-r", "5", "s.py"], "expected 0, 1, 2 or 3"),
        (["--nproc-per-node", "0", "s.py"], "at least 1"),
        (["--master-port", "99999", "s.py"], "expected a port number 0..65535"),
        ([], "required"),
    ],
)
@pytest.mark.slow
def test_bad_command_lines_exit_2(argv, message, pids):
    result, _ = run(argv, pids[0])
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_output_pump_prefixes_splits_and_flushes(monkeypatch):
    monkeypatch.setattr(output, "MAX_LINE", 10)
    read_end, write_end = os.pipe()
    dest, tail = io.BytesIO(), collections.deque(maxlen=2)
    pump = output.OutputPump()
    pump.add(read_end, "[p]:", dest, tail)
    pump.start()
    os.write(write_end, b"one\ntwo\n\n0123456789abcdef")
    deadline = time.monotonic() + 5
    while dest.getvalue().count(b"\n") < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.write(write_end, b"more\nlast")
    os.close(write_end)
    assert pump.wait(5)
    assert dest.getvalue() == b"[p]:one\n[p]:two\n[p]:\n[p]:0123456789abcdef\n[p]:more\n[p]:last\n"
    assert list(tail) == [b"more\n", b"last\n"]


def test_output_pump_adds_no_second_prefix_to_lines_that_have_it():
    """torch's excepthook writes ``[rank0]: `` before each traceback line: printed once."""
    read_end, write_end = os.pipe()
    dest = io.BytesIO()
    pump = output.OutputPump()
    pump.add(read_end, "[rank0]:", dest)
    os.write(write_end, b"[rank0]: Traceback\n\n[rank1]: other\nplain [rank0]:\n")
    os.close(write_end)
    assert pump.wait(5)
    assert dest.getvalue() == b"[rank0]: Traceback\n[rank0]:\n[rank0]:[rank1]: other\n[rank0]:plain [rank0]:\n"


@pytest.mark.slow
def test_store_port_in_use(pids):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        result, _ = run(["--master-port", str(port), WORKER, "env"], pids[0])
    assert result.returncode == 1 and "cannot start the store" in result.stderr, result.stderr
    assert not list(pids[0].iterdir())


# --- launching ---------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2, 4])
def test_env_seen_by_workers(nproc, pids):
    result, _ = run(["--nproc-per-node", str(nproc), WORKER, "env"], pids[0])
    assert result.returncode == 0, result.stderr
    envs = tagged(result.stdout, "ENV")
    assert sorted(envs) == list(range(nproc))
    run_ids = {e["TORCHELASTIC_RUN_ID"] for e in envs.values()}
    ports = {e["MASTER_PORT"] for e in envs.values()}
    assert len(run_ids) == 1 and run_ids != {""} and len(ports) == 1 and int(ports.pop()) > 0
    for rank, env in envs.items():
        assert env == {
            **env,
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(nproc),
            "ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1", "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "True",
            "OMP_NUM_THREADS": "1" if nproc > 1 else None,
        }
    assert ("Setting OMP_NUM_THREADS" in result.stderr) == (nproc > 1)


@pytest.mark.slow
def test_user_settings_reach_workers(pids):
    result, _ = run(
        ["--nproc_per_node=cpu", "--rdzv-id", "job7", "--role", "trainer", WORKER, "env"], pids[0], OMP_NUM_THREADS="3"
    )
    assert result.returncode == 0, result.stderr
    envs = tagged(result.stdout, "ENV")
    assert len(envs) == (os.cpu_count() or 1)
    assert {(e["TORCHELASTIC_RUN_ID"], e["ROLE_NAME"], e["OMP_NUM_THREADS"]) for e in envs.values()} == {
        ("job7", "trainer", "3")
    }
    assert "Setting OMP_NUM_THREADS" not in result.stderr


@pytest.mark.slow
def test_output_prefixed_and_args_passed_through(pids):
    args = ["--nproc-per-node", "x y", "-m", "--", "--master-port=1"]
    result, _ = run(["--nproc-per-node", "2", WORKER, "echo", *args], pids[0])
    assert result.returncode == 0, result.stderr
    assert tagged(result.stdout, "ARGS") == {0: args, 1: args}
    assert sorted(line for line in result.stdout.splitlines() if "partial" in line) == [
        "[rank0]:partial 0", "[rank1]:partial 1"
    ]
    assert sorted(line for line in result.stderr.splitlines() if "to stderr" in line) == [
        "[rank0]:to stderr from 0", "[rank1]:to stderr from 1"
    ]


@pytest.mark.slow
def test_lines_never_interleave(pids):
    result, _ = run(["--nproc-per-node", "3", WORKER, "spam", "300"], pids[0])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 900
    for line in lines:
        rank = line[5]
        assert line == f"[rank{rank}]:" + rank * 3000


@pytest.mark.slow
def test_module_and_console_script(pids):
    launcher = [str(Path(sys.executable).parent / "pydist-run")]
    result, _ = run(["--nproc-per-node", "2", "-m", "pydist_run_probe", "a", "-b"], pids[0], launcher=launcher)
    assert result.returncode == 0, result.stderr
    found = tagged(result.stdout, "MODULE")
    assert found == {r: {"name": "__main__", "argv": ["a", "-b"], "rank": str(r)} for r in (0, 1)}


@pytest.mark.slow
def test_no_python(pids):
    result, _ = run(["--nproc-per-node", "2", "--no-python", "/bin/sh", "-c", 'echo "sh $RANK/$WORLD_SIZE"'], pids[0])
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[rank0]:sh 0/2", "[rank1]:sh 1/2"]


@pytest.mark.slow
def test_an_executable_that_cannot_start_is_reported(pids, tmp_path):
    """It exists (a missing one is refused before any worker starts: test_launcher_messages.py)
    but its interpreter does not."""
    program = tmp_path / "prog"
    program.write_text("#!/nonexistent/interpreter\n")
    program.chmod(0o755)
    result, _ = run(["--nproc-per-node", "2", "--no-python", str(program)], pids[0])
    assert result.returncode == 1
    assert "cannot start worker 0" in result.stderr and str(program) in result.stderr


# --- failures ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_failing_rank_stops_the_others(pids):
    piddir = pids[0]
    result, seconds = run(["--nproc-per-node", "3", WORKER, "fail", "raise", "1"], piddir, timeout=90)
    assert result.returncode == 1
    assert seconds < STOPPED_NOT_AWAITED  # the others were stopped, not waited for
    assert len(all_pids(piddir)) == 3 and not any(map(is_running, all_pids(piddir)))
    summary = result.stderr[result.stderr.index("Root Cause"):]
    assert "rank      : 1 (local_rank: 1)" in summary
    assert f"exitcode  : 1 (pid: {(piddir / '1').read_text()})" in summary
    assert "Traceback (most recent call last)" in summary and "ValueError: boom from rank 1" in summary
    assert "<NO_OTHER_FAILURES>" in result.stderr and "ranks 0, 2" in summary


@pytest.mark.slow
@pytest.mark.parametrize("mode, exitcode", [("sigkill", "-9"), ("exit3", "3")])
def test_killed_or_exit_code_reported(mode, exitcode, pids):
    result, seconds = run(["--nproc-per-node", "2", WORKER, "fail", mode, "0"], pids[0], timeout=90)
    assert result.returncode == 1 and seconds < STOPPED_NOT_AWAITED  # the other was stopped, not waited for
    summary = result.stderr[result.stderr.index("Root Cause"):]
    assert "rank      : 0 (local_rank: 0)" in summary
    assert f"exitcode  : {exitcode} (pid:" in summary
    assert ("(SIGKILL)" in summary) == (mode == "sigkill")


@pytest.mark.slow
@pytest.mark.parametrize("mode, error", [("raise", "RuntimeError: boom"), ("exit3", "SystemExit: 3")])
def test_the_first_failure_is_the_root_cause_not_its_echo(mode, error, pids):
    """Rank 1 fails first; rank 0 then fails in all_reduce because rank 1 left (an echo).
    The report's root cause is rank 1's failure, by the time it happened, although rank 1's
    process exits last: its exit-time cleanup outlasts rank 0 every time (worker.py), until
    the launcher stops it."""
    result, _seconds = run(["--nproc-per-node", "2", WORKER, "group-fail", mode], pids[0], timeout=60)
    assert result.returncode == 1, result.stderr
    summary = result.stderr[result.stderr.index("Root Cause"):]
    assert "rank      : 1 (local_rank: 1)" in summary and error in summary, result.stderr
    assert "(SIGTERM)" in summary, result.stderr  # it was still running when rank 0's echo ended
    failures = result.stderr[result.stderr.index("Failures:"):result.stderr.index("Root Cause")]
    assert "rank      : 0 (local_rank: 0)" in failures, result.stderr


@pytest.mark.slow
def test_on_failure_continue_lets_the_survivors_shrink_and_finish(pids):
    """Rank 1 is SIGKILLed: the launcher says so and lets ranks 0 and 2 go on; they shrink
    to a group of 2, all_reduce on it, exit 0, and so does the launcher."""
    result, _seconds = run(["--nproc-per-node", "3", "--on-failure", "continue", WORKER, "shrink-on-failure"],
                           pids[0], timeout=60)
    assert result.returncode == 0, result.stderr
    assert "rank 1 (pid" in result.stderr and "failed with signal SIGKILL; the others go on" in result.stderr
    assert "1 worker(s) failed and 2 finished: rank 1 (signal SIGKILL)" in result.stderr
    assert "rank 0 recovered: rank 0 of 2, sum 2" in result.stdout
    assert "rank 2 recovered: rank 1 of 2, sum 2" in result.stdout
    assert "Root Cause" not in result.stderr


@pytest.mark.slow
def test_on_failure_continue_fails_the_job_when_no_worker_finishes(pids):
    result, _seconds = run(["--nproc-per-node", "2", "--on-failure", "continue", WORKER, "fail", "exit3", "all"],
                           pids[0], timeout=60)
    assert result.returncode == 1, result.stderr
    assert "Root Cause" in result.stderr and "exitcode  : 3" in result.stderr


def _segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("pydist-")}


@pytest.mark.slow
def test_a_job_stopped_during_its_first_collective_leaves_no_shared_memory(pids):
    """Rank 0 created the group's arena, rank 1 never mapped it (so nobody unlinked it), and
    the launcher is told to stop: after it exits, /dev/shm holds nothing of the job."""
    before = _segments()
    proc = start(["--nproc-per-node", "2", WORKER, "late-collective"], pids)
    deadline = time.monotonic() + 60
    while not any("-arena-" in name for name in _segments() - before):
        assert time.monotonic() < deadline and proc.poll() is None, "the arena never appeared"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    assert _segments() - before == set()


def start(args: list[str], pids) -> subprocess.Popen:
    piddir, started = pids
    proc = start_command([*LAUNCHER, *args], env=env_for(piddir))
    started.append(proc)
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_stops_everything(sig, pids):
    piddir = pids[0]
    proc = start(["--nproc-per-node", "2", "--shutdown-timeout", "1", WORKER, "sleep", "grandchild"], pids)
    wait_for_files(piddir, {"0", "1", "0.child", "1.child"})
    start_time = time.monotonic()
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 128 + sig
    assert time.monotonic() - start_time < STOPPED_NOT_AWAITED  # the workers (and their children) were stopped
    assert f"got {sig.name}" in stderr and "Root Cause" not in stderr
    assert len(all_pids(piddir)) == 4 and not any(map(is_running, all_pids(piddir)))


@pytest.mark.slow
def test_sigterm_ignored_then_sigkill(pids):
    piddir = pids[0]
    proc = start(["--nproc-per-node", "2", "--shutdown-timeout", "1", WORKER, "sleep", "ignore-term"], pids)
    wait_for_files(piddir, {"0", "1"})
    start_time = time.monotonic()
    proc.terminate()
    proc.communicate(timeout=90)
    assert proc.returncode == 128 + signal.SIGTERM
    # At least the --shutdown-timeout (the workers ignore SIGTERM), then SIGKILL: not their 60 s sleep.
    assert 0.9 < time.monotonic() - start_time < STOPPED_NOT_AWAITED
    assert not any(map(is_running, all_pids(piddir)))


@pytest.mark.slow
def test_two_launchers_at_once_get_different_ports_and_stores(pids):
    procs = [start(["--nproc-per-node", "2", WORKER, "store"], pids) for _ in range(2)]
    outs = [(c.stdout, c.stderr) for c in finish(procs, 30)]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    results = [tagged(out, "STORE") for out, _ in outs]
    assert all(r[0]["values"] == r[1]["values"] == ["value0", "value1"] for r in results)
    ports = [{r[0]["port"], r[1]["port"]} for r in results]
    assert all(len(p) == 1 for p in ports) and ports[0] != ports[1]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["store", "rendezvous"])
def test_workers_reach_the_agents_store(how, pids):
    result, _ = run(["--nproc-per-node", "3", WORKER, how], pids[0])
    assert result.returncode == 0, result.stderr
    values = {rank: found["values"] for rank, found in tagged(result.stdout, "STORE").items()}
    assert values == {r: ["value0", "value1", "value2"] for r in range(3)}


@pytest.mark.slow
def test_agent_in_process_leaks_nothing(pids):
    """Run the agent inside this process: afterwards no fd (socket, pipe) or thread is left
    and the signal handlers are the previous ones."""
    fds_before, threads_before = set(os.listdir("/proc/self/fd")), threading.active_count()
    handler_before = signal.getsignal(signal.SIGTERM)
    config = LaunchConfig(nproc_per_node=2, command=worker_command(WORKER, ["store"]), base_env=env_for(pids[0]))
    out, err = io.BytesIO(), io.BytesIO()
    assert Agent(config, stdout=out, stderr=err).run() == 0, err.getvalue()
    assert len(tagged(out.getvalue().decode(), "STORE")) == 2
    deadline = time.monotonic() + 5
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == threads_before
    fds_after = set(os.listdir("/proc/self/fd"))
    assert fds_after == fds_before, {fd: _fd_target(fd) for fd in fds_after ^ fds_before}  # what leaked
    assert signal.getsignal(signal.SIGTERM) is handler_before


def _fd_target(fd: str) -> str:
    """What file descriptor ``fd`` of this process is (socket:[inode], pipe:[inode], a path)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError as error:
        return f"closed since ({error.strerror})"
