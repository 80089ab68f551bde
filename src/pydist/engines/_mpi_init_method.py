"""The ``mpi://`` rendezvous for torch.distributed (registered by ``pydist.torch``).

``init_process_group("pydist", init_method="mpi://", pg_options=pydist.torch.Options("mpi"))``
under mpiexec then needs neither MASTER_ADDR/MASTER_PORT nor RANK/WORLD_SIZE: rank and
world size come from MPI.COMM_WORLD (a ``rank``/``world_size`` given to torch that differs
raises ValueError naming both), and torch gets a TCPStore hosted by rank 0 on a free port,
whose address (MASTER_ADDR if set, else rank 0's host name) reaches the others by MPI_Bcast.
The store serves torch only (its rendezvous and barriers); MPI groups move no data through it.
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

from ._mpi_world import load_mpi, rank_and_size

SCHEME = "mpi"


def _given(query: dict, name: str) -> int:
    values = query.get(name)
    return int(values[0]) if values else -1


def mpi_rendezvous(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs):
    """torch's rendezvous handler protocol: yields (store, rank, world size) once."""
    import torch.distributed as tdist

    query = parse_qs(urlparse(url).query)
    rank, size = rank_and_size(_given(query, "rank"), _given(query, "world_size"))
    comm = load_mpi().COMM_WORLD.Dup()
    try:
        store = None
        if rank == 0:
            store = tdist.TCPStore("0.0.0.0", 0, size, True, timeout, wait_for_workers=False)
            address = (os.environ.get("MASTER_ADDR") or socket.gethostname(), store.port)
        else:
            address = None
        host, port = comm.bcast(address, root=0)
    finally:
        comm.Free()
    if store is None:
        store = tdist.TCPStore(host, port, size, False, timeout)
    yield store, rank, size
    raise RuntimeError("mpi:// rendezvous cannot run again (MPI's world is fixed)")


def register() -> None:
    """Register ``mpi://`` with torch.distributed (idempotent)."""
    from torch.distributed.rendezvous import _rendezvous_handlers, register_rendezvous_handler
    if SCHEME not in _rendezvous_handlers:
        register_rendezvous_handler(SCHEME, mpi_rendezvous)
