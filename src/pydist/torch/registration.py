"""The "pydist" backend registered with torch.distributed, and the creator torch calls for
every group it makes (the default group and each new_group): a ``ProcessGroupPydist`` with
the engine and CUDA backend its options choose (options), on the default group's world
(placement; the default group's own world is the host of its new_groups), joined to a running job where the
rank replaces one (PYDIST_JOIN=1), with torch backends attached for other devices (devices),
or, for "cpu:pydist,cuda:pydist", its CUDA tensors on pydist's own device engine.
The ``mpi://`` init_method is registered beside it (rank and world size from MPI.COMM_WORLD,
a TCPStore hosted by rank 0).
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as tdist

from ..api.grow import join_standalone
from ..core.settings import settings
from ..groups.device_engines import allow
from ._group_count import agree_group_count
from ._store import TorchStore
from .backend import BACKEND_NAME, ProcessGroupPydist
from .devices import backend_string_map, make_backend, other_devices
from .options import cuda_choice, engine_of, remember_default
from .placement import host


def register() -> None:
    """Register "pydist" with torch.distributed, and the ``mpi://`` rendezvous (idempotent)."""
    if BACKEND_NAME.upper() not in tdist.Backend._plugins:
        tdist.Backend.register_backend(BACKEND_NAME, _create_extended, extended_api=True, devices=["cpu"])
        from ..engines._mpi_init_method import register as register_rendezvous
        register_rendezvous()


def create_process_group(store, rank: int, size: int, timeout: timedelta, options: Any = None,
                         global_ranks: list[int] | None = None) -> ProcessGroupPydist:
    """A torch ProcessGroup over pydist: (prefix store, group rank, group size, timeout);
    ``options``: see options.Options; ``global_ranks``: the members' world ranks (None: the
    world). In a replacement (PYDIST_JOIN=1) the default group joins the running job (torch.grow)."""
    default_group = not global_ranks
    engine = engine_of(options, default_group)
    cuda = cuda_choice(options, default_group)
    named = backend_string_map()
    devices = other_devices(named, cuda)
    if default_group and engine == "pydist" and settings().join:  # a replacement joins the running job
        if devices:
            raise ValueError(f"init_process_group: a replacement rank (PYDIST_JOIN=1) runs on pydist only; "
                             f"its group cannot make {devices} beside it")
        world = join_standalone(TorchStore(store), timeout.total_seconds())
        joined = world.default_group
        assert joined is not None
        group = ProcessGroupPydist(None, joined.rank(), joined.size(), timeout, engine, world=world)
        agree_group_count(world)
    else:
        group = ProcessGroupPydist(store, rank, size, timeout, engine, global_ranks)
        group_store = getattr(store, "underlying_store", store)  # torch's "cpu/" prefix off: make_backend adds its own
        for device, name in devices.items():
            group.attach(device, make_backend(name, device, group_store, rank, size, timeout))
    if default_group and engine == "pydist":
        host(group.pydist_world)  # its new_groups are groups of this world (placement)
    if (named or {}).get("cuda") == "pydist" and group._group is not None:
        allow(group._group)  # "cpu:pydist,cuda:pydist": pydist's own CUDA engine, asked for by name
    if default_group:
        remember_default(engine, cuda)
    return group


def _create_extended(opts, options: Any) -> ProcessGroupPydist:
    """torch's extended creator: _DistributedBackendOptions and the group's pg_options."""
    return create_process_group(opts.store, opts.group_rank, opts.group_size, opts.timeout, options,
                                list(opts.global_ranks_in_group or []))
