"""``pydist-bench --device``: pydist's device engine benchmarked on the strict stand-in (the
path a GPU run takes, without a GPU), every op with a row per size; the backends that do not
run those buffers say why in a note instead of failing the run; NCCL is compared with
--device cuda only."""
from __future__ import annotations

import json

import pytest
from test_bench_cli import check_report, run_bench

from pydist.bench.devices import unavailable
from pydist.bench.ops import OPS

pytestmark = pytest.mark.slow
SIZES = [4, 4096, 65536]


@pytest.mark.parametrize("op", sorted(OPS))
def test_every_op_on_the_stand_in_with_gloo_beside(op):
    done = run_bench("--device", "standin", "--op", op, "--nproc", "3", "--sizes", "4,4K,64K", "--iters", "2",
                     "--warmup", "1", "--compare", "gloo", "--json", timeout=240)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    notes = {backend["key"]: (backend["status"], backend["note"]) for backend in report["backends"]}
    assert notes["gloo"] == ("unavailable", "does not run standin buffers (--device standin)")
    report["backends"] = [backend for backend in report["backends"] if backend["key"] == "pydist"]
    for row in report["rows"]:
        row["results"] = {"pydist": row["results"]["pydist"]}
        row["ratios"] = {}
    check_report(report, op, ["pydist"], SIZES, nproc=3)


def test_cuda_buffers_without_a_gpu_are_named_not_run():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: make gpu-check runs --device cuda")
    assert unavailable("pydist", "cuda") == "no CUDA device here (torch.cuda.is_available() is False)"
    assert unavailable("mpi", "cuda") == "does not run cuda buffers (--device cuda)"
    done = run_bench("--device", "cuda", "--sizes", "4", "--iters", "1", timeout=60)
    assert done.returncode == 1 and "no CUDA device here" in done.stderr
    assert run_bench("--device", "standin", "--compare", "nccl").returncode == 2  # NCCL: CUDA buffers only
