"""torch names a new group by a per-process counter (``new_group``'s store prefix): a
replacement, whose counter starts afresh, takes the members' so that their later
``new_group`` calls meet."""
from __future__ import annotations

import numpy as np
import torch.distributed.distributed_c10d as c10d

from ..api.collectives import broadcast
from ..groups.world import World, using_world


def agree_group_count(world: World) -> None:
    """Every rank of ``world``'s default group takes its rank 0's torch group counter (a
    collective of that group: the members right after admitting, the joiners right after joining)."""
    count = np.array([c10d._world.group_count], np.int64)
    with using_world(world):
        broadcast(count, src=0)
    c10d._world.group_count = int(count[0])
