"""The rendezvous endpoint: the agents of one machine take turns to start the job's store
(the turn, :mod:`pydist.run.turn`), and a port held by another job's store is named as such.

Linux lets two SO_REUSEADDR sockets that bind one port at the same time both fail to listen
(EADDRINUSE) or both listen; agents that raced so took it for "another agent hosts it" and
were refused for connect_timeout, or hosted two stores on one port. The statistical version
(400 forked pairs started together) is in test_launcher_endpoint_soak.py (``make soak``).
"""
from __future__ import annotations

import secrets
import threading
import time
from datetime import timedelta

import pytest

from pydist.run import turn
from pydist.run.config import LaunchConfig
from pydist.run.endpoint import EndpointError, open_store
from pydist.store import TCPStore
from pydist.testing import free_port

#: Generous bounds (seconds) for a step that takes milliseconds, on a loaded 2-core machine.
PATIENCE_S = 60.0


def _config(port: int, host: str = "127.0.0.1", **kwargs) -> LaunchConfig:
    return LaunchConfig(nproc_per_node=1, command=["true"], node_rank=-1, master_addr=host, master_port=port,
                        **kwargs)


def _until(condition, what: str) -> None:
    """Poll ``condition`` (another thread or process sets it) for at most PATIENCE_S."""
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.005)


def _hosts(config: LaunchConfig, token: str | None = None) -> bool:
    """Open the job's store as an agent would, close it; whether this agent hosted it."""
    store, hosting = open_store(config, token)
    store.close()
    return hosting


class _Opener(threading.Thread):
    """open_store in a thread: ``result`` is (store, hosting) or the EndpointError."""

    def __init__(self, config: LaunchConfig, token: str | None = None):
        super().__init__(daemon=True)
        self.config, self.token, self.result = config, token, None

    def run(self) -> None:
        try:
            self.result = open_store(self.config, self.token)
        except EndpointError as error:
            self.result = error


def test_an_agent_waits_for_the_turn_and_then_joins_the_store_its_holder_started():
    """Deterministic: the turn is held (as the agent that starts the store holds it); the
    other agent keeps asking its holder (each ask is answered and counted) and does not start
    a store; once the holder's store runs and the turn is released, it connects to it."""
    port = free_port()
    holder = turn.take_turn("127.0.0.1", port, PATIENCE_S)
    assert holder is not None
    other = _Opener(_config(port, connect_timeout=PATIENCE_S))
    store = None
    try:
        other.start()
        _until(lambda: holder.answered >= 3, "the other agent to ask for the turn three times")
        assert other.is_alive() and other.result is None  # still waiting: it started no store
        store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, auth_token="")
    finally:
        holder.close()
    other.join(PATIENCE_S)
    joined, hosting = other.result
    try:
        assert hosting is False
        joined.set("k", b"v")
        assert store.get("k") == b"v"
    finally:
        joined.close()
        store.close()


def test_jobs_on_different_addresses_with_one_port_do_not_wait_for_each_other():
    port = free_port()
    holder = turn.take_turn("127.0.0.1", port, PATIENCE_S)
    try:
        assert _hosts(_config(port, host="127.0.0.2", connect_timeout=PATIENCE_S))
    finally:
        holder.close()


def test_the_turn_is_free_again_once_released():
    port = free_port()
    turn.take_turn("127.0.0.1", port, PATIENCE_S).close()
    again = turn.take_turn("127.0.0.1", port, 0.0)
    again.close()


# --- a port held by another job's store (issue 48) -------------------------------------------------

def _other_jobs_store(port: int, token: str) -> TCPStore:
    return TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, auth_token=token,
                    timeout=timedelta(seconds=30))


def test_another_jobs_store_is_named_without_tokens_or_retries_a_user_never_set():
    """A single-node job (its secret generated) meets another pydist-run job's store on the port."""
    port = free_port()
    other = _other_jobs_store(port, secrets.token_hex(8))
    try:
        with pytest.raises(EndpointError) as caught:
            open_store(_config(port, connect_timeout=PATIENCE_S), secrets.token_hex(8))
    finally:
        other.close()
    message = str(caught.value)
    assert "another job's pydist store" in message and f"127.0.0.1:{port}" in message, message
    assert "token" not in message.replace("a secret of its own", "") and "retried" not in message, message


def test_tokens_differ_is_said_only_when_this_job_was_given_one():
    port = free_port()
    other = _other_jobs_store(port, "the other job's token")
    try:
        with pytest.raises(EndpointError) as caught:
            open_store(_config(port, connect_timeout=PATIENCE_S, base_env={"PYDIST_AUTH_TOKEN": "ours"}), "ours")
    finally:
        other.close()
    message = str(caught.value)
    assert "refused this job's PYDIST_AUTH_TOKEN" in message and "tokens differ" in message, message
    assert "retried" not in message, message


def test_a_store_that_requires_a_token_this_job_lacks():
    port = free_port()
    other = _other_jobs_store(port, "a token")
    try:
        with pytest.raises(EndpointError) as caught:
            open_store(_config(port, connect_timeout=PATIENCE_S, max_nodes=2), None)
    finally:
        other.close()
    assert "requires a token and this job has none" in str(caught.value), caught.value


def test_the_job_store_of_the_same_token_is_joined():
    port = free_port()
    host = _other_jobs_store(port, "shared")
    try:
        assert not _hosts(_config(port, connect_timeout=PATIENCE_S, base_env={"PYDIST_AUTH_TOKEN": "shared"}),
                          "shared")
    finally:
        host.close()


def test_a_static_node_0_names_who_holds_its_port():
    port = free_port()
    other = _other_jobs_store(port, "x")
    try:
        with pytest.raises(EndpointError) as caught:
            open_store(LaunchConfig(nproc_per_node=1, command=["true"], node_rank=0, master_port=port), "y")
    finally:
        other.close()
    assert f"127.0.0.1:{port}" in str(caught.value) and "held by pid" in str(caught.value), caught.value
