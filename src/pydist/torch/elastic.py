"""``pydist.torch.Elastic``: pydist.Elastic for torch.distributed on the pydist plugin.

    torch.distributed.init_process_group("pydist")   # a replacement joins the running job here
    job = pydist.torch.Elastic({"model": model, "optimizer": optimizer}, progress={"step": 0})
    while job.progress["step"] < total_steps:
        if job.sync():
            ddp = torch.nn.parallel.DistributedDataParallel(model)
        try:
            ...one step on ddp...
            job.progress["step"] += 1
        except Exception as error:     # torch DDP's errors come through C++ as RuntimeError
            job.recover(error)

The world it shrinks and grows is torch's default group (pydist.torch.shrink_group and
admit_joiners), so every torch.distributed call and torch DDP run on the new one.
"""
from __future__ import annotations

import torch.distributed.distributed_c10d as c10d

from ..api.elastic import Elastic as NativeElastic
from ..core.errors import DistError
from ..groups.world import World
from .backend import ProcessGroupPydist
from .grow import admit_joiners
from .shrink import shrink_group


class Elastic(NativeElastic):
    """The state a torch.distributed job keeps across lost and replaced ranks (see the module note)."""

    def _world(self) -> World:
        group = c10d._get_default_group()
        if not isinstance(group, ProcessGroupPydist):
            raise TypeError(f"pydist.torch.Elastic needs the default group of backend 'pydist', got "
                            f"{type(group).__name__}")
        return group.pydist_world

    def _admit(self) -> list[int]:
        return admit_joiners()

    def _shrink(self, dead: list[int]) -> None:
        shrink_group(dead)

    def recover(self, error: BaseException) -> None:
        """pydist.Elastic.recover; an error that torch re-raised (DDP's, a RuntimeError) stands
        for what the default group's state says failed, if it knows."""
        super().recover(error if isinstance(error, DistError) else self._failure_behind(error))

    def _failure_behind(self, error: BaseException) -> DistError:
        """The DistError that failed the default group (the one torch wrapped); ``error`` itself,
        raised again, when the group has not failed."""
        group = self._world().default_group
        failed = group.state.failed if group is not None else None
        if isinstance(failed, DistError):
            return failed
        raise error
