"""PyTorch's own distributed test suite (shipped in the torch wheel) against pydist's plugin.

Not part of ``make test`` (hundreds of tests, each spawning torch processes); run it with

    BACKEND=pydist WORLD_SIZE=2 .venv/bin/python -m pytest tests/torch_suite/torch_distributed_suite.py -q

The class is assembled exactly as torch's test/distributed/test_distributed_spawn.py does
for gloo, with "pydist" declared a plugin backend (DistTestCases.backend_feature["plugin"])
and, since it supports them, a "ddp" and "subgroup" backend too (so that torch's
DistributedDataParallel and subgroup tests run instead of being skipped).
"""
import os
import sys

os.environ.setdefault("BACKEND", "pydist")
os.environ.setdefault("WORLD_SIZE", "2")

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402
from torch.testing._internal.common_utils import run_tests  # noqa: E402

import pydist.torch  # noqa: E402,F401 - registers the backend (also in spawned children)

for feature in ("plugin", "ddp", "subgroup"):
    DistTestCases.backend_feature[feature].add("pydist")

from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402


class TestPydistBackend(TestDistBackend, DistributedTest._DistTestBase):
    """torch's _DistTestBase, every test in 2 spawned ranks over pydist."""

    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    sys.exit(run_tests())
