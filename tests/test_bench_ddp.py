"""python -m pydist.bench.ddp: torch DDP step time over the plugin and gloo (smoke tests)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from pydist.bench import ddp
from pydist.testing.netns import require_netns

pytest.importorskip("torch")


def _table_rows(text: str) -> dict[str, list[float]]:
    return {m.group(1): [float(v) for v in m.group(2).split()]
            for m in re.finditer(r"^(?:\[rank0\]:)?  (gloo|pydist)\s+([\d. ]+)$", text, re.M)}


@pytest.mark.slow
def test_a_launched_job_prints_both_backends_and_the_loss_difference():
    command = [sys.executable, "-m", "pydist.run", "--nproc-per-node", "2", "-m", "pydist.bench.ddp",
               "--hidden", "64", "--steps", "2", "--warmup", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 ranks, 0.0M parameters" in done.stdout
    rows = _table_rows(done.stdout)
    assert set(rows) == {"gloo", "pydist"} and rows["gloo"][2] == 1.0
    difference = float(re.search(r"largest difference (\S+)", done.stdout).group(1))
    assert difference < 1e-4  # the same model, data and seed: only the summation order differs


def test_link_without_netns_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        ddp.main(["--link", "1gbit"])
    assert exit_info.value.code == 2
    assert "give --netns too" in capsys.readouterr().err


@pytest.mark.slow
def test_a_two_host_job_in_network_namespaces():
    require_netns()
    done = subprocess.run([sys.executable, "-m", "pydist.bench.ddp", "--netns", "2x1", "--hidden", "64",
                           "--steps", "2", "--warmup", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert set(_table_rows(done.stdout)) == {"gloo", "pydist"}
