"""pydist-bench smoke runs at tiny sizes: rows are produced and the arithmetic is right.
Nothing here is timed (benchmarks are a CLI, never asserts)."""
import importlib.util
import json
import subprocess
import sys

import pytest

from pydist.bench.ops import OPS
from pydist.bench.sizes import parse_sizes

BENCH = [sys.executable, "-m", "pydist.bench"]
TINY = ["--sizes", "4:64", "--iters", "2", "--warmup", "1", "--nproc", "2"]


def run_bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(BENCH + list(args), capture_output=True, text=True, timeout=timeout)


def test_size_specs():
    assert parse_sizes("4:64") == [4, 8, 16, 32, 64]
    assert parse_sizes("1K:16K:4") == [1024, 4096, 16384]
    assert parse_sizes("4,64K,1M") == [4, 65536, 1 << 20]
    assert parse_sizes("256M") == [256 << 20]
    for bad in ("0", "x", "4:2", "-1"):
        with pytest.raises(ValueError):
            parse_sizes(bad)


@pytest.mark.parametrize("op", sorted(OPS))
def test_every_op_produces_rows_with_consistent_bandwidths(op):
    done = run_bench("--op", op, "--json", *TINY)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["op"] == op and report["nproc"] == 2 and report["rows"]
    factor = report["busbw_factor"]
    assert factor == pytest.approx(OPS[op].bus_factor(2))
    for row in report["rows"]:
        result = row["results"]["pydist"]
        assert row["bytes"] > 0 and row["count"] > 0 and result["time_us"] > 0
        algbw = row["bytes"] / (result["time_us"] * 1e-6) / 1e9
        assert result["algbw_gbps"] == pytest.approx(algbw, rel=1e-6)
        assert result["busbw_gbps"] == pytest.approx(algbw * factor, rel=1e-6)


def test_table_output_names_the_command_and_has_a_row_per_size():
    done = run_bench("--op", "all_reduce", *TINY)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any("pydist-bench --op all_reduce" in line for line in lines if line.startswith("#"))
    rows = [line.split() for line in lines if line and not line.startswith("#")]
    assert [int(r[0]) for r in rows] == [4, 8, 16, 32, 64]
    assert [int(r[1]) for r in rows] == [1, 2, 4, 8, 16]


def test_compare_with_gloo():
    pytest.importorskip("torch")
    done = run_bench("--op", "all_reduce", "--json", "--compare", "gloo", *TINY, timeout=180)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for row in report["rows"]:
        assert row["results"]["gloo"]["time_us"] > 0
        ratio = row["results"]["gloo"]["time_us"] / row["results"]["pydist"]["time_us"]
        assert row["ratios"]["gloo"] == pytest.approx(ratio, rel=1e-6)


@pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py is not installed")
def test_compare_with_mpi():
    done = run_bench("--op", "broadcast", "--json", "--compare", "mpi", *TINY, timeout=180)
    assert done.returncode == 0, done.stderr
    assert all(row["results"]["mpi"]["time_us"] > 0 for row in json.loads(done.stdout)["rows"])


def test_missing_backend_is_a_note_not_a_crash():
    done = run_bench("--op", "all_reduce", "--backend", "mpi", *TINY)
    assert done.returncode != 0 and "does not exist" in (done.stdout + done.stderr)


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib is not installed")
def test_plot_writes_a_png(tmp_path):
    out = tmp_path / "bench.png"
    done = run_bench("--op", "all_reduce", "--plot", str(out), *TINY)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
