"""The reduce-op check cache: fast for the usual ops, bounded when PREMUL_SUM factors vary."""
from __future__ import annotations

import numpy as np

import pydist as dist
from pydist.api import collectives as _collectives
from pydist.core.buffers import as_buffer
from pydist.core.ops import _make_nccl_premul_sum
from pydist.testing import run_threads


def test_varying_premul_sum_factors_do_not_grow_the_cache():
    buffer = as_buffer(np.ones(4, dtype=np.float32), "tensor")
    before = len(_collectives._CHECKED_OPS)  # other tests of this process may have cached ops
    for step in range(10_000):
        op = _collectives._reduce_op(_make_nccl_premul_sum(1.0 / (step + 1)), buffer)
        assert op.factor == 1.0 / (step + 1)
    assert len(_collectives._CHECKED_OPS) == before


def test_all_reduce_with_a_new_factor_each_step_keeps_the_cache_small():
    def body(rank: int, size: int) -> float:
        tensor = np.zeros(1, dtype=np.float64)
        for step in range(1, 501):
            tensor[0] = 1.0
            dist.all_reduce(tensor, op=_make_nccl_premul_sum(float(step)))
        return float(tensor[0])

    before = len(_collectives._CHECKED_OPS)
    assert run_threads(2, body) == [1000.0, 1000.0]
    assert len(_collectives._CHECKED_OPS) == before


def test_common_ops_stay_cached():
    buffer = as_buffer(np.ones(4, dtype=np.int32), "tensor")
    first = _collectives._reduce_op(dist.ReduceOp.SUM, buffer)
    assert _collectives._reduce_op(dist.ReduceOp.SUM, buffer) is first
