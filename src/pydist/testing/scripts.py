"""Python scripts run as ``python script.py args`` would run them, but in a process forked from
the warm fork server of pydist.testing.processes, which imported numpy, pydist and whatever
``preload`` named (e.g. torch) once: a script that imports torch starts in milliseconds
instead of the seconds a fresh interpreter takes to import it again.

``start_script(path, args, env=..., cwd=...)`` starts one; ``finish_scripts(scripts, timeout)``
waits for several against one deadline and gives a ``subprocess.CompletedProcess`` each
(exit code, stdout, stderr as text), as ``pydist.testing.commands.finish`` does for commands.
The script runs as ``__main__`` with ``sys.argv`` = [path, *args], its directory first on
``sys.path``, ``env`` as its whole environment, in ``cwd``, stdin from /dev/null, in a
session of its own: at the deadline that session's processes (the script and whatever it
started there) are SIGKILLed and ``CommandTimeout`` is raised with what each printed.

Unlike a fresh interpreter, the modules the server imported are imported already: those
that read the environment when imported read the server's, from when it started.
"""
from __future__ import annotations

import atexit
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .commands import timed_out
from .processes import _CONTEXT

__all__ = ["WarmScript", "finish_scripts", "start_script"]


@dataclass
class WarmScript:
    """A script started by ``start_script``: its process and where its output goes."""

    argv: list[str]
    process: Any  # a forkserver multiprocessing.Process
    outdir: tempfile.TemporaryDirectory = field(repr=False)

    def output(self, stream: str) -> str:
        """What the script wrote to ``stream`` ("out" or "err") so far."""
        path = Path(self.outdir.name, stream)
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the session of the script, if it still runs (it and whatever it started there)."""
        if self.process.is_alive():  # not reaped yet: its pid, the session's id, is still its own
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _run(environ: dict[str, str], path: str, args: list[str], cwd: str, outdir: str) -> None:
    """The forked process: a session of its own, ``environ``, output files, ``cwd``, the script,
    then the atexit handlers, as an interpreter runs them when it ends (a forked process ends
    with os._exit, which skips them)."""
    os.setsid()
    os.environ.clear()
    os.environ.update(environ)
    for fd, name in ((1, "out"), (2, "err")):
        with open(os.path.join(outdir, name), "wb") as file:
            os.dup2(file.fileno(), fd)
    os.chdir(cwd)
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(path))
    try:
        runpy.run_path(path, run_name="__main__")
    finally:
        atexit._run_exitfuncs()


def start_script(path: str | os.PathLike, args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 cwd: str | os.PathLike | None = None) -> WarmScript:
    """Start ``python path *args`` forked from the warm fork server (see the module's docstring);
    ``env`` (default: this process's environment) is its whole environment."""
    path = os.path.abspath(path)
    outdir = tempfile.TemporaryDirectory(prefix="warm-script-")
    process = _CONTEXT.Process(target=_run, args=(dict(os.environ if env is None else env), path, list(args),
                                                  os.path.abspath(cwd or os.getcwd()), outdir.name),
                               name=f"pydist-script-{os.path.basename(path)}")
    process.start()
    return WarmScript([sys.executable, path, *args], process, outdir)


def finish_scripts(scripts: Sequence[WarmScript], timeout: float) -> list[subprocess.CompletedProcess]:
    """Wait for every script of ``scripts`` within ``timeout`` seconds in all: a CompletedProcess
    of each, in order. At the deadline kill the session of every script still running and raise
    CommandTimeout naming them, with every script's output."""
    deadline = time.monotonic() + timeout  # real time: the harness's bound on real processes
    for script in scripts:
        script.process.join(max(0.0, deadline - time.monotonic()))
    late = [script for script in scripts if script.process.is_alive()]
    for script in late:
        script.kill()
        script.process.join()
    done = [subprocess.CompletedProcess(s.argv, s.process.exitcode, s.output("out"), s.output("err"))
            for s in scripts]
    for script in scripts:
        script.outdir.cleanup()
    if late:
        raise timed_out(done, [script in late for script in scripts], timeout, "scripts", "sessions")
    return done
