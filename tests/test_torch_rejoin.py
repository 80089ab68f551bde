"""torch.distributed on the pydist plugin under ``pydist-run --on-failure replace``: a worker
SIGKILLed mid-backward (torch DDP's allreduce fails) is shrunk past, its replacement joins in
its own ``init_process_group("pydist")``, is healed by pydist.torch.Elastic, and torch DDP and
torch's new_group work on the grown world (tests/run_scripts/torch_replace_worker.py)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from pydist.testing.commands import run_command

pytest.importorskip("torch")
from pydist.torch.regroup import regrouping_supported  # noqa: E402

pytestmark = pytest.mark.slow

SCRIPT = str(Path(__file__).parent / "run_scripts" / "torch_replace_worker.py")
#: seconds 3 torch workers, a kill and a replacement's start (torch's import: seconds on a
#: loaded 2-core machine) may take before the test calls it hung (it takes 10-40 s); the
#: test's own timeout is above it, so that run_command stops the job's processes first
NOT_HUNG = 240.0


@pytest.mark.skipif(not regrouping_supported(), reason="this torch lacks the internals admit_joiners needs "
                    "(test_torch_shrink checks the error)")
@pytest.mark.timeout(NOT_HUNG + 60)
@pytest.mark.parametrize("victim", [2, 0], ids=["rank 2", "rank 0"])
def test_torch_ddp_takes_a_replacement_in_healed_and_grows_back(victim):
    argv = [sys.executable, "-m", "pydist.run", "--nproc-per-node", "3", "--on-failure", "replace", SCRIPT,
            "20", str(victim), "5"]
    done = run_command(argv, timeout=NOT_HUNG, env={**os.environ})
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in done.stdout.splitlines() if "RESULT " in line]
    assert sorted(r["joined"] for r in results) == [False, False, True]
    assert sorted(r["rank"] for r in results) == [0, 1, 2]
    assert len({r["checksum"] for r in results}) == 1  # the joiner was healed: one model everywhere
    assert len({r["step"] for r in results}) == 1 and all(r["new_group_sum"] == 3.0 for r in results)
    for result in (r for r in results if not r["joined"]):
        assert result["sizes"][:5] == [3] * 5 and 2 in result["sizes"] and result["sizes"][-1] == 3
    assert f"failed and were replaced: rank {victim}" in done.stderr
