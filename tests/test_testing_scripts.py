"""pydist.testing.scripts: a script forked from the warm fork server runs as ``python script.py
args`` would (argv, environment, working directory, its directory on sys.path, output, exit
code, an exception's traceback), and a script past its deadline is killed with all it started."""
from __future__ import annotations

import os
import sys
import time

import pytest

from pydist.testing.commands import CommandTimeout, run_command
from pydist.testing.scripts import finish_scripts, start_script

pytestmark = pytest.mark.slow  # the first script starts the fork server (numpy, pydist: ~1 s)

SHOW = """
import os, sys
import neighbour
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("WARM_SCRIPT_VALUE"), neighbour.NAME)
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def test_a_script_runs_as_python_would_run_it(tmp_path):
    (tmp_path / "show.py").write_text(SHOW)
    (tmp_path / "neighbour.py").write_text("NAME = 'found beside the script'\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "WARM_SCRIPT_VALUE": "given"}
    done, = finish_scripts([start_script(tmp_path / "show.py", ["3", "x y"], env=env, cwd=work)], timeout=60)
    plain = run_command(done.args, env=env, cwd=work)
    assert done.args == [sys.executable, str(tmp_path / "show.py"), "3", "x y"]
    assert (done.returncode, done.stdout, done.stderr) == (plain.returncode, plain.stdout, plain.stderr) \
        == (3, f"argv ['3', 'x y'] cwd {work} env given found beside the script\n", "to stderr\n")


def test_an_exception_exits_1_with_its_traceback(tmp_path):
    (tmp_path / "fail.py").write_text("raise RuntimeError('the script failed')\n")
    done, = finish_scripts([start_script(tmp_path / "fail.py")], timeout=60)
    assert done.returncode == 1 and "RuntimeError: the script failed" in done.stderr, done.stderr


HANG = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_script_past_its_deadline_is_killed_with_what_it_started(tmp_path):
    (tmp_path / "hang.py").write_text(HANG)
    script = start_script(tmp_path / "hang.py")
    ends = time.monotonic() + 60
    while not script.output("out") and time.monotonic() < ends:
        time.sleep(0.02)  # a file the script writes: nothing to wait on but the file system
    child = int(script.output("out"))
    with pytest.raises(CommandTimeout, match=r"1 of 1 scripts still running after 0.1 s(.|\n)*killed: still running"):
        finish_scripts([script], timeout=0.1)
    ends = time.monotonic() + 30  # the orphaned child is reaped by init once killed
    while os.path.exists(f"/proc/{child}") and time.monotonic() < ends:
        time.sleep(0.02)
    assert not os.path.exists(f"/proc/{child}"), "the script's child outlived the timeout"
