"""The call descriptions (core.opspec.describe, the one cache in front of the engine's plans):
the reduce op checked once per call shape, fast for the usual ops, bounded when PREMUL_SUM
factors vary."""
from __future__ import annotations

import numpy as np
import pytest

import pydist as dist
from pydist.core import opspec
from pydist.core.buffers import as_buffer
from pydist.core.ops import RedOpType, ReduceOp, _make_nccl_premul_sum
from pydist.testing import run_threads


def test_varying_premul_sum_factors_share_one_spec_and_do_not_grow_the_cache():
    buffer = as_buffer(np.ones(4, dtype=np.float32), "tensor")
    first = opspec.describe("all_reduce", "all_reduce", buffer, op=_make_nccl_premul_sum(0.5))
    before = len(opspec._SPECS)  # other tests of this process may have described calls
    for step in range(10_000):
        op = _make_nccl_premul_sum(1.0 / (step + 1))
        spec = opspec.describe("all_reduce", "all_reduce", buffer, op=op)
        assert spec is first and spec.op is None and spec.reduce_op is RedOpType.PREMUL_SUM
        assert opspec.op_of(spec, op).factor == 1.0 / (step + 1)
    assert len(opspec._SPECS) == before


def test_all_reduce_with_a_new_factor_each_step_keeps_the_cache_small():
    def body(rank: int, size: int) -> float:
        tensor = np.zeros(1, dtype=np.float64)
        for step in range(1, 501):
            tensor[0] = 1.0
            dist.all_reduce(tensor, op=_make_nccl_premul_sum(float(step)))
        return float(tensor[0])

    before = len(opspec._SPECS)
    assert run_threads(2, body) == [1000.0, 1000.0]
    assert len(opspec._SPECS) <= before + 4  # the group's set-up calls, not one per factor


def test_common_ops_stay_described_and_checked_once():
    buffer = as_buffer(np.ones(4, dtype=np.int32), "tensor")
    first = opspec.describe("all_reduce", "all_reduce", buffer, op=dist.ReduceOp.SUM)
    assert opspec.describe("all_reduce", "all_reduce", buffer, op=dist.ReduceOp.SUM) is first
    assert opspec.describe("all_reduce", "all_reduce", buffer, op=ReduceOp(RedOpType.SUM)) is first
    assert opspec.op_of(first, dist.ReduceOp.SUM) is first.op == ReduceOp(RedOpType.SUM)


def test_an_op_the_dtype_cannot_take_raises_every_time():
    buffer = as_buffer(np.ones(4, dtype=np.float32), "tensor")
    for _ in range(2):
        with pytest.raises(TypeError, match="BXOR is a bitwise op"):
            opspec.describe("all_reduce", "all_reduce", buffer, op=dist.ReduceOp.BXOR)


def test_an_op_met_after_its_spec_was_made_is_found_at_once_next_time(monkeypatch):
    """A spec made for one spelling of an op (a ReduceOp) and then asked for with another (the
    RedOpType): from the second call on, found as given (no check)."""
    buffer = as_buffer(np.ones(3, dtype=np.int16), "tensor")
    first = opspec.describe("all_reduce", "all_reduce", buffer, op=ReduceOp(RedOpType.MAX))
    checks = []
    real = opspec.as_reduce_op
    monkeypatch.setattr(opspec, "as_reduce_op", lambda op: checks.append(op) or real(op))
    for _ in range(3):
        assert opspec.describe("all_reduce", "all_reduce", buffer, op=RedOpType.MAX) is first
    assert checks == [RedOpType.MAX]
