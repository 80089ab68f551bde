"""How hierarchical algorithms lay every rank's part host after host (algorithms/_partition)."""
import numpy as np

from pydist.algorithms._partition import end_to_end, packed_by_host


def test_end_to_end_spans_views_of_one_tensor_in_order():
    flat = np.arange(10, dtype=np.float32)
    joined = end_to_end([flat[0:3], flat[3:3], flat[3:7], flat[7:10]])
    assert joined is not None and joined.size == 10
    joined[...] = -1
    assert (flat == -1).all()


def test_end_to_end_refuses_parts_out_of_order_apart_or_of_mixed_dtypes():
    flat = np.arange(12, dtype=np.float32)
    assert end_to_end([flat[4:8], flat[0:4]]) is None  # round-robin hosts: host order is not memory order
    assert end_to_end([flat[0:4], flat[5:8]]) is None
    assert end_to_end([flat[0:4], flat[4:8].view(np.int32)]) is None
    assert end_to_end([flat[0:8:2]]) is None
    assert end_to_end([]) is None


def test_packed_by_host_lays_parts_host_after_host():
    parts, host_blocks = packed_by_host([[0, 2], [1]], [2, 4, 3], np.arange(9))
    assert parts[0].tolist() == [0, 1] and parts[2].tolist() == [2, 3, 4] and parts[1].tolist() == [5, 6, 7, 8]
    assert [b.tolist() for b in host_blocks] == [[0, 1, 2, 3, 4], [5, 6, 7, 8]]
