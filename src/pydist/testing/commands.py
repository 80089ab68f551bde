"""Run commands (Python programs, the launcher, mpiexec) as child processes for tests.

Every command runs in a session of its own (so in a process group of its own), with its
stdout and stderr captured as text. ``finish`` waits for all of them against one deadline,
reading every pipe at once (a command blocked on a full pipe cannot stall the others);
when the deadline passes it kills the process group of every command still running and
raises ``CommandTimeout`` with the output each produced so far. So a hung command never
outlives the test that started it, and its output says where it hung.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["CommandTimeout", "finish", "kill_group", "run_command", "start_command", "timed_out"]


class CommandTimeout(AssertionError):
    """Commands did not finish in time; the message holds what each printed before it was killed."""


def start_command(argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen:
    """Start ``argv`` in a new session, stdin from /dev/null, stdout and stderr captured as text
    (any of these can be overridden through ``popen_kwargs``, e.g. ``env``, ``cwd``)."""
    options: dict[str, Any] = dict(stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
    options.update(popen_kwargs)
    return subprocess.Popen(list(argv), **options)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group ``proc`` leads (it and whatever it started there)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def finish(procs: Sequence[subprocess.Popen], timeout: float) -> list[subprocess.CompletedProcess]:
    """Wait for every command of ``procs`` (from start_command) within ``timeout`` seconds in all;
    return a CompletedProcess of each, in order. On timeout kill the process group of every
    command still running, collect its output, and raise CommandTimeout naming the commands
    that were still running, with every command's output."""
    outputs: list[tuple[str, str] | None] = [None] * len(procs)

    def read(i: int) -> None:
        outputs[i] = procs[i].communicate()

    readers = [threading.Thread(target=read, args=(i,), name=f"command-reader-{i}", daemon=True)
               for i in range(len(procs))]
    for reader in readers:
        reader.start()
    deadline = time.monotonic() + timeout  # real time: the harness's bound on real processes
    for reader in readers:
        reader.join(max(0.0, deadline - time.monotonic()))
    late = [proc for proc, reader in zip(procs, readers) if reader.is_alive()]
    for proc in late:
        kill_group(proc)
    for reader in readers:
        reader.join()  # the pipes close once the killed groups are gone
    done = [subprocess.CompletedProcess(proc.args, proc.returncode, *(out or ("", "")))
            for proc, out in zip(procs, outputs)]
    if late:
        raise timed_out(done, [proc in late for proc in procs], timeout, "commands", "process groups")
    return done


def timed_out(done: Sequence[subprocess.CompletedProcess], killed: Sequence[bool], timeout: float, what: str,
              groups: str) -> CommandTimeout:
    """The CommandTimeout of ``done`` (``what``: "commands"), those ``killed`` marked: how many
    were still running after ``timeout`` s (their ``groups`` killed), and each one's output."""
    report = "\n".join(f"--- {' '.join(map(str, c.args))} (exit {c.returncode}"
                       f"{', killed: still running' if k else ''})\n"
                       f"stdout:\n{c.stdout}\nstderr:\n{c.stderr}" for c, k in zip(done, killed))
    return CommandTimeout(f"{sum(killed)} of {len(done)} {what} still running after {timeout:g} s, "
                          f"their {groups} killed:\n{report}")


def run_command(argv: Sequence[str], timeout: float = 60.0, **popen_kwargs) -> subprocess.CompletedProcess:
    """Run one command to completion (see ``finish``): its CompletedProcess, output as text."""
    return finish([start_command(argv, **popen_kwargs)], timeout)[0]
