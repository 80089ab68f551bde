"""``pydist.torch.shrink_group``: torch.distributed.shrink_group for groups of backend "pydist".

``torch.distributed.shrink_group`` (torch 2.11 to 2.14) cannot reach a Python backend: it
asks the group's CPU backend (``pg._get_backend(cpu)``: this plugin's group itself, which
says ``supports_shrinking = False``, so torch raises TypeError) to shrink and registers what
that returns as a C++ ``c10d::Backend`` (which Python cannot even construct before torch
2.14), while this plugin's group is a ProcessGroup. So this function does torch's steps
itself with the same signature, checks and wording: the survivors agree and get a pydist
group over the same connections (the group's world shrinks it as the process's does:
``pydist.api.shrink.shrink``); it is wrapped as a torch ProcessGroup and registered as torch
registers a shrunk group (the default one then becomes the new default: ranks renumbered,
the other groups destroyed). When rank 0, the host of torch's env:// store, is gone, the new
group's store is one the new rank 0 serves (pydist's store server speaks torch's protocol),
so torch's later ``new_group`` calls work. torch DDP can
then be built on the result.
"""
from __future__ import annotations

import logging
from typing import Any

import torch.distributed as tdist
import torch.distributed.distributed_c10d as c10d

from ..api.shrink import SHRINK_DEFAULT, shrink
from .backend import ProcessGroupPydist
from .regroup import require_regrouping, reregister

_log = logging.getLogger("pydist")


def shrink_group(ranks_to_exclude: list[int], group: Any = None, shrink_flags: int = SHRINK_DEFAULT,
                 pg_options: Any = None) -> tdist.ProcessGroup:
    """torch.distributed.shrink_group for a group of backend "pydist" (see the module note)."""
    require_regrouping("pydist.torch.shrink_group")
    target = group if group is not None else c10d._get_default_group()
    if not isinstance(target, ProcessGroupPydist):
        raise TypeError(f"group: pydist.torch.shrink_group shrinks groups of backend 'pydist', got "
                        f"{type(target).__name__}; torch.distributed.shrink_group serves NCCL")
    is_default = target == c10d._get_default_group()
    name, desc = c10d._get_process_group_name(target), target.getGroupDesc()
    original_ranks = tdist.get_process_group_ranks(target)
    old_store = c10d._world.pg_map[target][1]
    world, parent = target.pydist_world, target.pydist_group
    kept_before = [world.transport_rank(g) for g in parent.ranks]  # the transport ranks of target's ranks
    old_store_server = world.owned_store
    shrunk = shrink(world, parent, ranks_to_exclude, shrink_flags)
    remaining = [original_ranks[kept_before.index(world.transport_rank(g))] for g in shrunk.ranks]
    new_store = world.owned_store if world.owned_store is not old_store_server else None
    store = old_store if new_store is None else tdist.TCPStore(new_store.host, new_store.port,  # type: ignore[attr-defined]
                                                               is_master=False, wait_for_workers=False)
    group_name = c10d._process_group_name(remaining, use_hashed_name=True)
    created = reregister(target, shrunk, remaining, group_name,
                         "default:shrunken" if is_default else f"{desc or name}:shrunk", store)
    _log.info("pydist.torch.shrink_group: %s -> %s, ranks %s", name, group_name, remaining)
    return created
