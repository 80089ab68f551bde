"""What pydist-run says when a job cannot run or is stopped (issue 48, item 7): a known
configuration error is one paragraph for the job, not a traceback per rank; Ctrl-C is one
line; SIGKILLing workers that ignored SIGTERM is announced; a script that does not exist is
refused before any worker starts.
"""
from __future__ import annotations

import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest

from pydist.testing.commands import finish, run_command, start_command

LAUNCHER = [sys.executable, "-m", "pydist.run"]

#: Joins a 2-rank pydist job, then calls all_reduce in a loop (print "READY" once).
LOOP = textwrap.dedent("""
    import numpy as np, pydist as dist
    dist.init_process_group()
    x = np.ones(1 << 16, dtype=np.float32)
    dist.all_reduce(x)
    print("READY", flush=True)
    while True:
        dist.all_reduce(x)
        x[:] = 1.0
""")


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("OMP_NUM_THREADS", None)
    env.update(extra)
    return env


def _script(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.py"
    path.write_text(text)
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("variable, value, code", [
    ("PYDIST_SOCKET_IFNAME", "nosuch0", 1),  # the workers find it: a paragraph from the launcher
    ("PYDIST_TCP_CONNECT", "sometimes", 2),  # the launcher's own check, before any worker starts
])
def test_a_configuration_error_is_one_paragraph_for_the_job(tmp_path, variable, value, code):
    """Before: a 10-frame traceback per rank and again in the summary (~100 lines for 4 ranks)."""
    script = _script(tmp_path, LOOP)
    result = run_command([*LAUNCHER, "--nproc-per-node", "4", script], env=_env(**{variable: value}), timeout=120)
    err = result.stderr
    assert result.returncode == code, err
    assert "Traceback" not in err and err.count(variable) == 1 and value in err, err
    assert "[rank" not in err and len(err.strip().splitlines()) <= 8, err


def _until_ready(proc, ranks: int) -> None:
    """Read the job's stdout until ``ranks`` ranks printed READY."""
    ready = 0
    while ready < ranks:
        line = proc.stdout.readline()
        assert line, "the job ended before its ranks were ready"
        ready += line.endswith("READY\n")


@pytest.mark.slow
def test_ctrl_c_is_one_line_for_the_job(tmp_path):
    """SIGINT to the launcher (Ctrl-C) while the ranks are inside collectives: before, a
    KeyboardInterrupt traceback per rank (35 lines each)."""
    proc = start_command([*LAUNCHER, "--nproc-per-node", "2", _script(tmp_path, LOOP)], env=_env())
    _until_ready(proc, 2)
    proc.send_signal(signal.SIGINT)
    result = finish([proc], 120)[0]
    assert result.returncode == 128 + signal.SIGINT, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith(("pydist-run", "[rank"))]
    assert lines == ["pydist-run: got SIGINT; stopping the workers"], result.stderr


@pytest.mark.slow
def test_sigkill_after_the_shutdown_timeout_is_announced(tmp_path):
    """Workers that ignore SIGTERM are SIGKILLed after --shutdown-timeout: the launcher says so."""
    script = _script(tmp_path, textwrap.dedent("""
        import signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("READY", flush=True)
        time.sleep(120)
    """))
    proc = start_command([*LAUNCHER, "--nproc-per-node", "2", "--shutdown-timeout", "1", script], env=_env())
    _until_ready(proc, 2)
    proc.terminate()
    result = finish([proc], 120)[0]
    assert result.returncode == 128 + signal.SIGTERM
    assert "SIGKILL" in result.stderr and "--shutdown-timeout" in result.stderr, result.stderr
    assert "ranks 0, 1" in result.stderr, result.stderr


@pytest.mark.parametrize("flags", [[], ["--no-python"], ["--run-path"]])
def test_a_script_that_does_not_exist_starts_no_worker(tmp_path, flags):
    missing = str(tmp_path / "no_such_script.py")
    result = run_command([*LAUNCHER, "--nproc-per-node", "2", *flags, missing], env=_env(), timeout=60)
    assert result.returncode == 2, result.stderr
    assert missing in result.stderr and "[rank" not in result.stderr + result.stdout, result.stderr
