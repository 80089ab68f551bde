"""Registering a group that a shrink or a grow made of an existing one with torch.distributed,
as torch registers the group its own shrink_group makes: the old torch group gives its world
and the new pydist group up to a new ProcessGroupPydist; a new default group replaces torch's default (the other
groups destroyed, as torch does). It uses torch.distributed internals: a torch that lacks
one is refused at the call (``require_regrouping``), before the group changes."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed.distributed_c10d as c10d

from ..groups.process_group import ProcessGroup
from .backend import BACKEND_NAME, ProcessGroupPydist

#: the torch.distributed internals a regrouping calls
NEEDED = ("_get_default_group", "_get_process_group_name", "_process_group_name", "_destroy_all_other_groups",
          "_cleanup_process_group_global_state", "_update_default_pg")
#: registering a group in torch's tables: torch 2.14's name, then torch 2.11's
REGISTERS = ("_register_pg_in_world", "_update_process_group_global_state")


def _missing() -> list[str]:
    missing = [name for name in NEEDED if not hasattr(c10d, name)]
    if not any(hasattr(c10d, name) for name in REGISTERS):
        missing.append(" or ".join(REGISTERS))
    return missing


def regrouping_supported() -> bool:
    """Whether this torch has every internal that registering a regrouped group needs
    (torch 2.11 to 2.14 do; 2.8 does not)."""
    return not _missing()


def require_regrouping(feature: str) -> None:
    """RuntimeError naming ``feature`` and this torch's version where torch lacks an internal
    that registering a regrouped group needs."""
    missing = _missing()
    if missing:
        raise RuntimeError(f"{feature}: this torch ({torch.__version__}) lacks torch.distributed's "
                           f"{', '.join(missing)}, which registering the new group as torch registers its own "
                           "shrunk group needs (torch 2.11 to 2.14 have them)")


def reregister(target: ProcessGroupPydist, group: ProcessGroup, ranks: list[int], group_name: str, desc: str,
               store: Any) -> ProcessGroupPydist:
    """A torch group over ``group``, the pydist group of ``target``'s world that a shrink or a
    grow made of ``target``'s: registered under ``group_name`` with ``ranks`` (the torch global
    ranks of its members, in group rank order) and ``store``, in ``target``'s place (the
    default group when ``target`` was)."""
    is_default = target == c10d._get_default_group()
    backend_config = c10d._world.pg_backend_config.get(target, BACKEND_NAME)
    if is_default:
        c10d._destroy_all_other_groups(exclude_group=target)
    c10d._cleanup_process_group_global_state(target)
    world = target.hand_over()  # its world (where it was its own) now belongs to the new group
    created = ProcessGroupPydist(None, group.rank(), group.size(), timedelta(seconds=group.timeout), target.engine,
                                 world=world, group=group)
    created.setGroupName(group_name)
    created.setGroupDesc(desc)
    if is_default:
        c10d._update_default_pg(created)
    register = next(getattr(c10d, name) for name in REGISTERS if hasattr(c10d, name))
    register(pg=created, backend_name=BACKEND_NAME, store=store, group_name=group_name,
             backend_config=backend_config, rank_mapping={g: i for i, g in enumerate(ranks)})
    return created
