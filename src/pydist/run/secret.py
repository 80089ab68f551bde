"""The job's shared secret: who may touch the job's stores and its ranks' connections.

With PYDIST_AUTH_TOKEN set (in the launcher's environment) the launcher uses it. Without it,
a single-node job (``--nnodes`` at most 1) gets a random per-job secret
(``secrets.token_hex``): the agent's rendezvous store and each round's workers' store require
it, and the workers get it in their environment (PYDIST_AUTH_TOKEN) only, never through a
store, so their stores and transports require it too; an outsider who reaches the job's
ports can neither read nor write its stores nor dial its ranks. The other nodes of a
multi-node job could not get a generated secret safely, so such a job without a token (and
without TLS) stays open, and the launcher says so once (:data:`OPEN_JOB_NOTE`).

The secret is never written to a store, a log line or an error message.
"""
from __future__ import annotations

import secrets

from ..net.auth import TOKEN_ENV
from ..net.tls import VARIABLES as TLS_VARIABLES
from .config import LaunchConfig

#: Bytes of randomness in a generated secret (hex-encoded: twice as many characters).
SECRET_BYTES = 32

OPEN_JOB_NOTE = (
    "WARNING: this multi-node job has no shared secret, so it is open: anyone who can "
    "reach its store ({endpoint}) or its workers' ports can read and write the store, join as a rank, "
    "inject data and stop the job. To close it, set the same PYDIST_AUTH_TOKEN (a long random secret, "
    "e.g. python -c \"import secrets; print(secrets.token_hex(32))\") in the environment of pydist-run "
    "on every node, or give every node mutual TLS (PYDIST_TLS_CERT, PYDIST_TLS_KEY, PYDIST_TLS_CA or "
    "--tls-cert/--tls-key/--tls-ca). A single-node job gets a random per-job secret by itself."
)


def uses_tls(config: LaunchConfig) -> bool:
    """Whether the job's connections are mutual TLS (all of PYDIST_TLS_* set)."""
    return all(config.base_env.get(name) for name in TLS_VARIABLES)


def job_secret(config: LaunchConfig) -> tuple[str | None, str | None]:
    """(the job's secret or None, the note to print once or None): PYDIST_AUTH_TOKEN from the
    launcher's environment; else a new random one for a single-node job; else none, with
    :data:`OPEN_JOB_NOTE` unless the job uses TLS."""
    given = config.base_env.get(TOKEN_ENV)
    if given:
        return given, None
    if config.max_nodes <= 1:
        return secrets.token_hex(SECRET_BYTES), None
    if uses_tls(config):
        return None, None
    return None, OPEN_JOB_NOTE.format(endpoint=f"{config.master_addr}:{config.master_port}")
