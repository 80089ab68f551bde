"""core.ops.reduce_rows (one ufunc call over the rows of an arena's view) gives the bits of
reduce_many (one call per part), for every reduce op and dtype: the shared-memory
algorithms use either, and every rank must get the same result."""
from __future__ import annotations

import numpy as np
import pytest

from pydist.core.ops import RedOpType, ReduceOp, reduce_many, reduce_rows

FLOATS = (np.float16, np.float32, np.float64, np.complex64)
INTS = (np.int8, np.uint8, np.int32, np.int64)
ARITHMETIC = (RedOpType.SUM, RedOpType.AVG, RedOpType.PRODUCT, RedOpType.MIN, RedOpType.MAX)
BITWISE = (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR)


def _rows(dtype, count: int, length: int) -> np.ndarray:
    """``count`` rows of ``length`` values spread over many magnitudes (sums round differently
    in another order), as strided rows of a wider buffer, as the arena's slots are."""
    rng = np.random.default_rng(count * 1000 + length)
    if np.dtype(dtype).kind in "fc":
        values = rng.standard_normal((count, length)) * 10.0 ** rng.integers(-4, 5, (count, length))
    elif dtype is np.bool_:
        values = rng.integers(0, 2, (count, length))
    else:
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, (count, length), endpoint=True)
    wide = np.zeros((count, length + 16), dtype)
    wide[:, :length] = values.astype(dtype)
    return wide[:, :length]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 16])
@pytest.mark.parametrize("dtype", FLOATS + INTS + (np.bool_,))
def test_reduce_rows_gives_the_bits_of_reduce_many(dtype, count):
    ops = BITWISE if dtype in INTS + (np.bool_,) else ()
    ops += (RedOpType.SUM, RedOpType.PRODUCT) if dtype is np.bool_ else ARITHMETIC
    if np.dtype(dtype).kind == "c":
        ops = (RedOpType.SUM, RedOpType.PRODUCT)
    rows = _rows(dtype, count, 257)
    for kind in ops:
        op = ReduceOp(kind)
        expected, got = np.empty(257, dtype), np.empty(257, dtype)
        with np.errstate(all="ignore"):
            reduce_many(list(rows), expected, op)
            reduce_rows(rows, got, op)
        assert got.tobytes() == expected.tobytes(), (np.dtype(dtype).name, kind.name, count)
