"""Attacks on the launcher by another local user or a stray program (issue 46, item 5).

The launcher's turn (an abstract Unix socket any local user can bind) held by a stranger, and
a program on the rendezvous port that is not a pydist store: each made a job wait the whole
rendezvous read timeout (64 s, 63 s) and then blame "another agent of this machine" or "did not
answer authentication in time". Now each fails the launch at once, or within
:data:`pydist.run.turn.ANSWER_SECONDS` for a holder that says nothing, naming the holder and the
port. The in-process tests shorten that wait; the end-to-end ones run pydist-run as a user would.
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from pydist.run import turn
from pydist.run.config import LaunchConfig
from pydist.run.endpoint import EndpointError, open_store
from pydist.testing import free_port
from pydist.testing.commands import run_command

pytestmark = pytest.mark.adversarial

LAUNCHER = [sys.executable, "-m", "pydist.run"]
#: The rendezvous read timeout of the end-to-end runs: the old launcher waited all of it.
READ_TIMEOUT_S = 60
NOBODY = 65534

def _config(port: int) -> LaunchConfig:
    return LaunchConfig(nproc_per_node=1, command=["true"], node_rank=-1, master_addr="127.0.0.1", master_port=port,
                        connect_timeout=READ_TIMEOUT_S)


def _launch(port: int, tmp_path) -> tuple[subprocess.CompletedProcess, float]:
    script = tmp_path / "job.py"
    script.write_text("print('the job ran')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    started = time.monotonic()
    result = run_command([*LAUNCHER, "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                          "--rdzv-conf", f"read_timeout={READ_TIMEOUT_S}", str(script)],
                         env=env, timeout=3 * READ_TIMEOUT_S)
    return result, time.monotonic() - started


@contextlib.contextmanager
def _turn_held_by_another_user(port: int):
    """A forked process of uid NOBODY holding (listening on) the turn of 127.0.0.1:``port``
    until the ``with`` block ends; its pid. (Forked, not started: that user may not be allowed
    to run this interpreter, nor to import its modules.)"""
    name = turn.turn_name("127.0.0.1", port)  # here: that user may not read the interpreter's modules
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit
        try:
            os.close(ready_r)
            os.close(hold_w)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(name)
            sock.listen(1)
            os.write(ready_w, b"1")
            os.read(hold_r, 1)  # until the parent closes its end
        finally:
            os._exit(0)
    os.close(ready_w)
    os.close(hold_r)
    try:
        assert os.read(ready_r, 1) == b"1"
        yield pid
    finally:
        os.close(hold_w)
        os.close(ready_r)
        os.waitpid(pid, 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_a_turn_held_by_another_user_fails_the_launch_at_once_naming_it(tmp_path):
    port = free_port()
    with _turn_held_by_another_user(port) as pid:
        result, took = _launch(port, tmp_path)
    assert result.returncode == 1, result.stderr
    assert f"pid {pid}" in result.stderr and f"uid {NOBODY}" in result.stderr, result.stderr
    assert f"127.0.0.1:{port}" in result.stderr and "the job ran" not in result.stdout, result.stderr
    assert took < READ_TIMEOUT_S, f"waited {took:.1f}s: the whole read timeout, as before"


@pytest.fixture
def short_answers(monkeypatch):
    """A holder that says nothing is a stranger after 0.5 s (5 s in a real launch)."""
    monkeypatch.setattr(turn, "ANSWER_SECONDS", 0.5)


def _refused(port: int) -> str:
    with pytest.raises(EndpointError) as caught:
        open_store(_config(port), "a job secret")
    return str(caught.value)


def test_a_turn_held_by_a_process_of_this_user_that_is_not_an_agent(short_answers):
    port = free_port()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stranger:
        stranger.bind(turn.turn_name("127.0.0.1", port))
        stranger.listen(1)  # and never answers
        message = _refused(port)
    assert "did not answer as a pydist-run agent" in message and f"pid {os.getpid()}" in message, message
    assert f"127.0.0.1:{port}" in message, message


def test_a_turn_bound_by_a_socket_that_does_not_listen(short_answers):
    port = free_port()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stranger:
        stranger.bind(turn.turn_name("127.0.0.1", port))
        message = _refused(port)
    assert "does not listen" in message and f"pid {os.getpid()}" in message, message


def test_a_silent_program_on_the_port_is_not_taken_for_a_store(short_answers):
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):  # accepts (the kernel does) and never answers
        message = _refused(port)
    assert "not a pydist store" in message and f"127.0.0.1:{port}" in message, message
    assert f"pid {os.getpid()}" in message, message


def test_a_program_that_answers_something_else_is_not_taken_for_a_store(short_answers):
    port = free_port()
    server = socket.create_server(("127.0.0.1", port))

    def answer() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            with conn:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                conn.recv(1)

    answering = threading.Thread(target=answer, daemon=True)
    answering.start()
    try:
        message = _refused(port)
    finally:
        server.close()
        answering.join(10.0)
    assert "not a pydist store" in message and "HTTP/1.1" in message, message


@pytest.mark.slow  # waits the 5 s a silent program has to answer
def test_a_silent_program_on_the_c10d_port_fails_the_launch_naming_the_port(tmp_path):
    """Issue 48's acceptance: within 15 s, naming the port and that it is not a pydist store."""
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):
        result, took = _launch(port, tmp_path)
    assert result.returncode == 1, result.stderr
    assert f"127.0.0.1:{port}" in result.stderr and "not a pydist store" in result.stderr, result.stderr
    assert took < READ_TIMEOUT_S, f"waited {took:.1f}s: the whole read timeout, as before"
