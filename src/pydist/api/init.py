"""init_process_group and destroy_process_group: torch's signatures, rendezvous rules and errors.
A process that joins a running job (PYDIST_JOIN=1, see api.grow) waits there to be admitted."""
from __future__ import annotations

import atexit
from datetime import timedelta
from typing import Any

from ..core import init_marks
from ..core.settings import settings
from ..groups import farewell
from ..groups.factory import join_mpi, join_native, leave, make_group
from ..groups.process_group import ProcessGroup
from ..groups.world import current, process_world
from ..rendezvous import rendezvous
from ..store import TCPStore
from .groups import NON_GROUP_MEMBER, Backend, not_initialized, timeout_seconds
from .grow import join_running_job


def init_process_group(backend: str | None = None, init_method: str | None = None,
                       timeout: timedelta | None = None, world_size: int = -1, rank: int = -1,
                       store: Any = None, group_name: str = "", pg_options: Any = None,
                       device_id: Any = None) -> None:
    """Join the default process group (torch's signature and rendezvous rules).

    ``backend="mpi"``: under mpiexec/srun, rank and world size come from MPI.COMM_WORLD
    (a ``rank``/``world_size`` that differs raises ValueError naming both); ``init_method``
    and ``store`` are not used, as by torch's MPI backend (MPI's launcher did the rendezvous).
    """
    init_marks.mark(init_marks.INIT_START)
    world = current()
    if world.default_group is not None:
        raise ValueError("trying to initialize the default process group twice!")
    backend_name = Backend(backend or Backend.PYDIST)
    if store is not None and init_method is not None:
        raise ValueError("Cannot specify both init_method and store.")
    seconds = timeout_seconds(timeout)
    if backend_name == Backend.MPI:
        join_mpi(world, rank, world_size)
    else:
        owned = None
        if store is None:
            store, rank, world_size = rendezvous(init_method or "env://", rank, world_size,
                                                 timedelta(seconds=seconds))
            owned = store
        elif world_size <= 0:
            raise ValueError(f"world_size: must be positive when store is given, got {world_size}")
        elif rank < 0:
            raise ValueError(f"rank: must be non-negative when store is given, got {rank}")
        init_marks.mark(init_marks.STORE_READY)
        if not 0 <= rank < world_size:
            if owned is not None:
                owned.close()
            raise ValueError(f"rank: expected 0 <= rank < world_size ({world_size}), got {rank}")
        if settings().join:
            join_running_job(world, store, seconds, owned)
            return
        join_native(world, rank, world_size, store, seconds, backend_name, owned,
                    store_host=0 if isinstance(owned, TCPStore) else None)
    ranks = list(range(world.size))
    group_id, _name = world.group_id(ranks)
    make_group(world, ranks, group_id, group_name or "default_pg", seconds, default=True)
    init_marks.mark(init_marks.INIT_DONE)


def destroy_process_group(group: ProcessGroup | None = None) -> None:
    """Destroy one group, or (None) every group, the transport and the store."""
    world = current()
    if group is NON_GROUP_MEMBER:
        return
    if world.default_group is None:
        raise not_initialized()
    if group is not None and group is not world.default_group:
        group.destroy(timeout=group.timeout)
        world.remove_group(group)
        return
    leave(world)


@atexit.register
def _destroy_at_exit() -> None:
    """At interpreter exit, tell the peers of every world still joined why this process ends
    (groups.farewell: the failure that ends it, or none), then destroy the process's groups
    (best effort: the process is ending)."""
    farewell.at_exit()
    world = process_world()
    if world.default_group is not None:
        try:
            leave(world, finished=False)  # a crash or an eviction, as likely as the end: no "job ended"
        except Exception:  # noqa: BLE001 - nothing can be reported any more
            pass
