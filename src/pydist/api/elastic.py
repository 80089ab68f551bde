"""``Elastic``: a training loop that loses ranks and takes replacements in, in a few lines.

    model, optimizer = ..., ...       # what takes time first: once a replacement is admitted,
    pydist.init_process_group()       # the others wait for it (PYDIST_JOIN=1: it joins here)
    job = pydist.Elastic({"model": model, "optimizer": optimizer}, progress={"step": 0})
    while job.progress["step"] < total_steps:
        if job.sync():                 # a step boundary: the world changed (rebuild DDP on it)
            ddp = pydist.DistributedDataParallel(model)
        try:
            ...one step on ddp...
            job.progress["step"] += 1
        except pydist.DistError as error:
            job.recover(error)         # shrink past the dead; the step is done again (no
                                       # collective until the next sync(): it reports the change)

``state`` may hold pydist's DistributedSampler: a replacement gets its epoch and start, and
``sampler.set_epoch(epoch, start=...)`` resumes an epoch on a changed world with no sample
skipped or taken twice. torch programs on the plugin use ``pydist.torch.Elastic`` (torch's
default group, torch DDP).

``sync()`` admits the ranks waiting to join (admit_joiners) and heals them from the members
(api.heal: the state and ``progress`` of rank 0 and up to ``stripes`` members); on a
replacement, the first ``sync()`` is where it receives them. ``recover(error)`` shrinks the
default group past the ranks ``error`` names dead; when the survivors' progress differs (one
finished the step the others failed in), those that differ from rank 0 take the state and
progress of those that match it (striped over up to ``stripes`` of them). Both return
whether the world changed, so that what depends on the group (DDP) is rebuilt.
"""
from __future__ import annotations

import pickle
import zlib
from typing import Any

import numpy as np

from ..core.errors import DistError
from ..groups.world import World, current, using_world
from .collectives import all_gather_into_tensor
from .groups import get_rank, get_world_size
from .grow import admit_joiners
from .heal import heal
from .shrink import shrink_group


class Elastic:
    """The state a training job keeps across lost and replaced ranks (see the module note)."""

    def __init__(self, state: dict[str, Any], progress: dict[str, Any] | None = None, stripes: int = 4):
        """``state``: what a replacement must receive (modules, optimizers, samplers, arrays);
        ``progress``: picklable training position (step, epoch, ...), kept in ``self.progress``."""
        self.state = state
        self.progress: dict[str, Any] = {} if progress is None else progress
        self.stripes = stripes
        #: a process that joined the running job is healed at its first sync
        self._to_heal = self._world().joined
        self._changed = False

    def _world(self) -> World:
        """The World whose default group the job runs on (the torch plugin's: pydist.torch.Elastic)."""
        return current()

    def _admit(self) -> list[int]:
        return admit_joiners()

    def _shrink(self, dead: list[int]) -> None:
        shrink_group(dead)

    def sync(self) -> bool:
        """A step boundary, called by every rank: admit and heal the ranks waiting to join (a
        replacement: be healed); a rank lost meanwhile is recovered from (``recover``). True
        when the world changed since the last call."""
        changed, self._changed = self._changed, False
        with using_world(self._world()):
            try:
                if self._to_heal:
                    self._to_heal = False
                    self._heal_newcomers(joined=[get_rank()])
                    return True
                if changed:  # recovered in a step: report it and admit nobody now, as a rank
                    return True  # that recovered inside sync does (both go on with the same collectives)
                joined = self._admit()
                if joined:
                    self._heal_newcomers(joined)
                    return True
            except DistError as error:  # a rank died during the admission or the healing
                self.recover(error)
                self._changed = False
                return True
        return False

    def _heal_newcomers(self, joined: list[int]) -> None:
        members = [rank for rank in range(get_world_size()) if rank not in joined]
        heal(self.state, self.progress, members, joined, self.stripes)

    def recover(self, error: DistError) -> None:
        """After ``error`` (a DistError of a collective of the default group): shrink past the
        ranks it names dead; survivors whose progress differs from rank 0's take the state and
        progress of those that match it."""
        dead = sorted(error.dead_ranks)
        evicted = self._world().states.evicted_by
        if evicted is not None:  # the others declared this rank dead (it was stopped): it is out
            raise evicted from error
        if not dead:  # nobody known dead (a timeout, a desync): nothing to recover from here
            raise error
        self._shrink(dead)
        with using_world(self._world()):
            behind = self._differing()
            if behind:
                ahead = [rank for rank in range(get_world_size()) if rank not in behind]
                heal(self.state, self.progress, ahead, behind, self.stripes)
        self._changed = True

    def _differing(self) -> list[int]:
        """The survivors whose progress differs from rank 0's (usually none: the failure came
        before any of them finished the step); they take the state of those that match it."""
        digest = zlib.crc32(pickle.dumps(sorted(self.progress.items(), key=lambda item: str(item[0]))))
        digests = np.zeros(get_world_size(), np.int64)
        all_gather_into_tensor(digests, np.array([digest], np.int64))
        return [rank for rank in range(get_world_size()) if digests[rank] != digests[0]]
