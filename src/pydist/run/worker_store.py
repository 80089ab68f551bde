"""The workers' store: a fresh TCPStore for every round, at the workers' MASTER_ADDR:MASTER_PORT.

torch's ``env://`` rendezvous under an agent (TORCHELASTIC_USE_AGENT_STORE=True) connects to
the store at MASTER_ADDR:MASTER_PORT and, since torch 2.4, adds no per-attempt prefix to its
keys ("we create a new TCPStore for every retry"); but torchrun's c10d rendezvous keeps one
shared server for the whole job and its static one reuses the agents' store, so a restarted
attempt reads the keys the failed one left (gloo's peer addresses, pydist's shared-memory
names) and fails or hangs. pydist-run keeps its promise instead: the round's node 0 starts a
new store on a free port for each round, publishes where it is in the rendezvous, and closes
it when its workers are gone; the agents' own rendezvous keys stay in the job's store.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from . import records
from .agent_rendezvous import Rendezvous, Round


@dataclass(frozen=True)
class WorkerStoreAddress:
    """Where the workers of one round find their store."""

    addr: str
    port: int


class WorkerStore:
    """One round's workers' store as one agent sees it: hosted here (node 0) or elsewhere.

    ``bind_addr`` is the address node 0 serves on (and advertises): the job store's
    address when this agent hosts that one too, else this agent's own rendezvous address.
    ``auth_token`` is the token the store requires (None: PYDIST_AUTH_TOKEN, "": none); the
    job's secret, which the workers get in their environment. A node 0 that cannot start it
    publishes why; every member then leaves the round with a
    RendezvousError saying so, as does a member that finds nothing within ``wait_s`` seconds.
    """

    def __init__(self, rdzv: Rendezvous, round_: Round, bind_addr: str, wait_s: float,
                 auth_token: str | bytes | None = None):
        self.round = round_
        self._rdzv = rdzv
        self._auth_token = auth_token
        self._server: Any = None
        if round_.node_rank == 0:
            self.address = self._serve(bind_addr, wait_s)
        else:
            self.address = self._find(wait_s)

    def _serve(self, bind_addr: str, wait_s: float) -> WorkerStoreAddress:
        from pydist.store import TCPStore  # lazily, as endpoint.open_store

        try:
            self._server = TCPStore(bind_addr, 0, is_master=True, wait_for_workers=False,
                                    timeout=timedelta(seconds=wait_s), auth_token=self._auth_token)
        except RuntimeError as exc:  # DistNetworkError and friends
            message = f"cannot start the workers' store for round {self.round.number} on {bind_addr}: {exc}"
            self._rdzv.publish(self.round.number, "workers_store", json.dumps({"error": message}))
            self._rdzv.refuse(self.round.number, self.round.nnodes, message)
        address = WorkerStoreAddress(bind_addr, self._server.port)
        self._rdzv.publish(self.round.number, "workers_store", json.dumps(address.__dict__))
        return address

    def _find(self, wait_s: float) -> WorkerStoreAddress:
        record = self._rdzv.published(self.round.number, "workers_store", wait_s, records.workers_store)
        if "error" in record:
            self._rdzv.refuse(self.round.number, self.round.nnodes, record["error"])
        return WorkerStoreAddress(record["addr"], int(record["port"]))

    def close(self) -> None:
        """Stop the server if this agent hosts it (its keys go with it)."""
        if self._server is not None:
            self._server.close()
            self._server = None
