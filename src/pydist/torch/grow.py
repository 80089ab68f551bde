"""``pydist.torch.admit_joiners``: torch.distributed on the pydist plugin takes replacement
ranks in (pydist.admit_joiners' protocol, on the default torch group's world).

A replacement (started by ``pydist-run --on-failure replace``, PYDIST_JOIN=1) joins inside its
``torch.distributed.init_process_group("pydist")``: that call returns once the members admitted
it, with its rank and the grown size. The members call ``admit_joiners()`` together between
steps; when it admits some, torch's default group is replaced by the grown one (registered as
pydist.torch.shrink_group registers a shrunk one: the other groups destroyed, ranks
0..n-1 with the members first in their order), so torch DDP is rebuilt on it.
"""
from __future__ import annotations

import logging
from datetime import timedelta

import torch.distributed.distributed_c10d as c10d

from ..api.grow import admit_joiners as admit_pydist_joiners
from ..groups.world import using_world
from ._group_count import agree_group_count
from .backend import ProcessGroupPydist
from .regroup import require_regrouping, reregister

_log = logging.getLogger("pydist")


def admit_joiners(timeout: timedelta | float | None = None) -> list[int]:
    """Admit the ranks waiting to join into torch's default group (see the module note); the
    global ranks they got (usually none). Called by every rank of the default group."""
    require_regrouping("pydist.torch.admit_joiners")
    target = c10d._get_default_group()
    if not isinstance(target, ProcessGroupPydist):
        raise TypeError(f"pydist.torch.admit_joiners grows a default group of backend 'pydist', got "
                        f"{type(target).__name__}")
    world = target.pydist_world
    with using_world(world):
        joined = admit_pydist_joiners(timeout)
    if not joined:
        return []
    store = c10d._world.pg_map[target][1]
    ranks = list(range(world.size))
    name = f"{c10d._process_group_name(ranks, use_hashed_name=True)}:grown{world.generation}"
    assert world.default_group is not None  # the grown group
    reregister(target, world.default_group, ranks, name, "default:grown", store)
    agree_group_count(world)
    _log.info("pydist.torch.admit_joiners: ranks %s joined; %d ranks", joined, len(ranks))
    return joined
