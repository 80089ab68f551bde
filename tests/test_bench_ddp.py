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
    assert "2 ranks, 0.0M parameters" in done.stdout and "2 steps after 1; slowest rank per step" in done.stdout
    rows = _table_rows(done.stdout)
    assert set(rows) == {"gloo", "pydist"} and rows["gloo"][2] == 1.0
    for median, best, ratio in rows.values():  # median and best step of 2 timed ones, and gloo's / this
        assert 0 < best <= median and ratio > 0, rows
    difference = float(re.search(r"largest difference (\S+)", done.stdout).group(1))
    assert difference < 1e-4  # the same model, data and seed: only the summation order differs


def test_the_report_gives_each_backends_median_and_best_step_and_the_ratio_to_gloo():
    """Times in are already each step's slowest rank's (all_reduce MAX): the report sorts
    them, prints the median and the best, gloo's median over each backend's, and the
    largest difference between the two backends' losses."""
    import argparse
    results = {"gloo": ([0.006, 0.002, 0.004], [2.5, 2.25, 2.0], 1234567),
               "pydist": ([0.001, 0.003, 0.002], [2.5, 2.25, 2.0001], 1234567)}
    args = argparse.Namespace(batch=32, steps=3, warmup=1, bucket_mb=25.0)
    lines = ddp.report(results, args, 4).splitlines()
    assert lines[0] == ("# DDP step (torch DistributedDataParallel), 4 ranks, 1.2M parameters (5 MB of gradients, "
                        "25 MB buckets), batch 32 per rank, 3 steps after 1; slowest rank per step")
    assert _table_rows("\n".join(lines)) == {"gloo": [4.0, 2.0, 1.0], "pydist": [2.0, 1.0, 2.0]}
    assert lines[-1] == ("# losses (rank 0): gloo 2.500000 -> 2.000000, pydist 2.500000 -> 2.000100; "
                         "largest difference 1.00e-04")


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
