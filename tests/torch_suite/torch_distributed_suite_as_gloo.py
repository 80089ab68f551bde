"""PyTorch's own distributed suite with pydist impersonating gloo.

torch gates many tests on the backend's name being "gloo" (monitored_barrier, gloo-only
options, the gloo entries of its skip tables). Here BACKEND is "gloo" and every group torch
creates with backend "gloo" is a pydist group: ``distributed_c10d.ProcessGroupGloo`` (the
class torch instantiates for "gloo" and checks groups against) is replaced, in this process
and in every rank torch spawns, by :class:`PydistAsGloo`. Run it (not part of ``make test``):

    WORLD_SIZE=2 .venv/bin/python -m pytest tests/torch_suite/torch_distributed_suite_as_gloo.py -q -rs

Tests that check the backend's *name* see "gloo" from torch's own bookkeeping
(``get_backend``) but "pydist" from the group object (``getBackendName``): the one test
failing here, test_ddp_logging_data_cpu, compares DDP's logged "backend_name" (the group
object's) with ``dist.get_backend()``. Profiler events are named "gloo:<op>" here
(``profiling_name``), as torch's profiling tests expect of a "gloo" group.
"""
import os
import sys
from datetime import timedelta
from types import SimpleNamespace

os.environ["BACKEND"] = "gloo"
os.environ.setdefault("WORLD_SIZE", "2")

import torch.distributed.distributed_c10d as c10d  # noqa: E402

import pydist  # noqa: E402
from pydist.torch import ProcessGroupPydist  # noqa: E402 - also registers "pydist"


class PydistAsGloo(ProcessGroupPydist):
    """A pydist group built with ProcessGroupGloo's signature, where torch builds a gloo one."""

    profiling_name = "gloo"  # torch's tests look for the profiler events of dist.get_backend(): "gloo:all_reduce"

    def __init__(self, store, rank: int, size: int, timeout: timedelta = c10d.default_pg_timeout):
        super().__init__(store, rank, size, timeout)
        # torch writes the members' world ranks and the group's name here after creating gloo
        self.options = SimpleNamespace(global_ranks_in_group=[], group_name="", _timeout=timeout)

    def _set_sequence_number_for_group(self) -> None:
        """gloo agrees a starting sequence number over the store; pydist's groups start at 0 on every rank."""

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """torch's ``dist.monitored_barrier`` lands here for a "gloo" group: pydist's own."""
        assert self._group is not None, "monitored_barrier on a destroyed group"
        pydist.monitored_barrier(self._group, timeout, wait_all_ranks=wait_all_ranks)


c10d.ProcessGroupGloo = PydistAsGloo  # type: ignore[misc,assignment]

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestGlooImpersonatedByPydist(TestDistBackend, DistributedTest._DistTestBase):
    """torch's _DistTestBase for gloo, every test in 2 spawned ranks over pydist."""

    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    sys.exit(run_tests())
