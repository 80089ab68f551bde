"""Misuse of buffers: wrong list lengths and tensor sizes, read-only outputs (read-only inputs
are fine). Each raises at the call naming the argument; the group stays usable
(helpers: tests/misuse_support.py)."""
from __future__ import annotations

import numpy as np
import pytest
from misuse_support import clean_process_world, ro, run2, transport  # noqa: F401 - fixtures used by every test here

import pydist as dist

# -- wrong list lengths and sizes -----------------------------------------------------------

ONE = lambda n=2: np.ones(n)  # noqa: E731
SHAPES = {
    # name: (call(rank, size), exception, match, ranks that make the call)
    "all_gather-list-short": (lambda r, s: dist.all_gather([ONE()], ONE()), ValueError, "tensor_list", None),
    "all_gather-list-long": (lambda r, s: dist.all_gather([ONE()] * 3, ONE()), ValueError, "tensor_list", None),
    "all_gather-own-slot-size": (lambda r, s: dist.all_gather([ONE(3), ONE(3)], ONE()), ValueError,
                                 "tensor_list", None),
    "gather-list-long": (lambda r, s: dist.gather(ONE(), [ONE()] * 3, dst=0), ValueError, "gather_list", [0]),
    "gather-list-item-size": (lambda r, s: dist.gather(ONE(), [ONE(), ONE(5)], dst=0), ValueError,
                              "gather_list", [0]),
    "gather-list-missing-on-dst": (lambda r, s: dist.gather(ONE(), None, dst=0), ValueError, "gather_list", [0]),
    "scatter-list-short": (lambda r, s: dist.scatter(ONE(), [ONE()], src=0), ValueError, "scatter_list", [0]),
    "scatter-list-item-size": (lambda r, s: dist.scatter(ONE(), [ONE(), ONE(3)], src=0), ValueError,
                               "scatter_list", [0]),
    "reduce_scatter-list-long": (lambda r, s: dist.reduce_scatter(ONE(), [ONE()] * 3), ValueError,
                                 "input_list", None),
    "reduce_scatter-item-size": (lambda r, s: dist.reduce_scatter(ONE(), [ONE(), ONE(4)]), ValueError,
                                 "input_list", None),
    "all_to_all-output-long": (lambda r, s: dist.all_to_all([ONE()] * 3, [ONE()] * 2), ValueError,
                               "output_tensor_list", None),
    "all_to_all-input-short": (lambda r, s: dist.all_to_all([ONE()] * 2, [ONE()]), ValueError,
                               "input_tensor_list", None),
    "all_gather_into_tensor-output-3": (lambda r, s: dist.all_gather_into_tensor(ONE(3), ONE()), ValueError,
                                        "output_tensor", None),
    "all_gather_into_tensor-output-5": (lambda r, s: dist.all_gather_into_tensor(ONE(5), ONE()), ValueError,
                                        "output_tensor", None),
    "all_gather_into_tensor-output-2": (lambda r, s: dist.all_gather_into_tensor(ONE(2), ONE()), ValueError,
                                        "output_tensor", None),
    "reduce_scatter_tensor-input-3": (lambda r, s: dist.reduce_scatter_tensor(ONE(), ONE(3)), ValueError,
                                      r"\binput\b", None),
    "reduce_scatter_tensor-output-3": (lambda r, s: dist.reduce_scatter_tensor(ONE(3), ONE(4)), ValueError,
                                       r"\boutput\b|\binput\b", None),
    "all_to_all_single-splits": (lambda r, s: dist.all_to_all_single(ONE(4), ONE(4), [1, 1], [2, 2]),
                                 ValueError, r"\boutput\b|split", None),
    "all_to_all_single-not-divisible": (lambda r, s: dist.all_to_all_single(ONE(3), ONE(3)), ValueError,
                                        r"\boutput\b|\binput\b", None),
    "all_gather-not-a-list": (lambda r, s: dist.all_gather(ONE(4), ONE()), TypeError, "tensor_list", None),
}


@pytest.mark.parametrize("case", list(SHAPES))
def test_wrong_lengths_and_sizes(case, transport):
    call, exc, match, callers = SHAPES[case]

    def fn(rank, size):
        if callers is None or rank in callers:
            with pytest.raises(exc, match=match):
                call(rank, size)

    run2(fn, transport)


# -- read-only outputs ----------------------------------------------------------------------

READ_ONLY = {
    # name: (call(rank), argument named in the message, ranks that make the call)
    "all_reduce": (lambda r: dist.all_reduce(ro()), "tensor", None),
    "broadcast": (lambda r: dist.broadcast(ro(), src=0), "tensor", None),
    "reduce-dst": (lambda r: dist.reduce(ro(), dst=0), "tensor", [0]),
    "recv": (lambda r: dist.recv(ro(), src=0), "tensor", [1]),
    "irecv": (lambda r: dist.irecv(ro(), src=0), "tensor", [1]),
    "recv-bytes": (lambda r: dist.recv(b"\0" * 16, src=0), "tensor", [1]),
    "scatter-output": (lambda r: dist.scatter(ro(), None, src=0), "tensor", [1]),
    "all_gather-list": (lambda r: dist.all_gather([np.zeros(2), ro()], np.ones(2)), r"tensor_list\[1\]", None),
    "gather-list": (lambda r: dist.gather(np.ones(2), [ro(), np.zeros(2)], dst=0), r"gather_list\[0\]", [0]),
    "reduce_scatter-output": (lambda r: dist.reduce_scatter(ro(), [np.ones(2)] * 2), r"\boutput\b", None),
    "all_gather_into_tensor-output": (lambda r: dist.all_gather_into_tensor(ro((0.0,) * 4), np.ones(2)),
                                      "output_tensor", None),
    "reduce_scatter_tensor-output": (lambda r: dist.reduce_scatter_tensor(ro(), np.ones(4)), r"\boutput\b", None),
    "all_to_all-output": (lambda r: dist.all_to_all([ro(), np.zeros(2)], [np.ones(2)] * 2),
                          r"output_tensor_list\[0\]", None),
}


@pytest.mark.parametrize("case", list(READ_ONLY))
def test_read_only_output(case, transport):
    call, name, callers = READ_ONLY[case]

    def fn(rank, size):
        if callers is None or rank in callers:
            with pytest.raises(ValueError, match=name) as info:
                call(rank)
            assert "read-only" in str(info.value) or "readonly" in str(info.value) or "writ" in str(info.value)

    run2(fn, transport)


def test_read_only_inputs_are_fine(transport):
    """Inputs are only read: read-only arrays (and bytes) are accepted where they are inputs."""

    def fn(rank, size):
        out = {}
        if rank == 0:
            dist.send(ro((5.0, 6.0)), dst=1)
            dist.send(np.array([7, 8], np.uint8).tobytes(), dst=1)
        else:
            got, raw = np.zeros(2), bytearray(2)
            dist.recv(got, src=0)
            dist.recv(raw, src=0)
            out["recv"], out["bytes"] = got.tolist(), list(raw)
        gathered = [np.zeros(2), np.zeros(2)]
        dist.all_gather(gathered, ro((float(rank),) * 2))
        out["all_gather"] = [g.tolist() for g in gathered]
        flat = np.zeros(4)
        dist.all_gather_into_tensor(flat, ro((float(rank),) * 2))
        out["all_gather_into_tensor"] = flat.tolist()
        mine = np.zeros(2)
        dist.scatter(mine, [ro((0.0, 0.0)), ro((1.0, 1.0))] if rank == 0 else None, src=0)
        out["scatter"] = mine.tolist()
        reduced = np.zeros(2)
        dist.reduce_scatter(reduced, [ro((1.0, 1.0)), ro((2.0, 2.0))])
        out["reduce_scatter"] = reduced.tolist()
        return out

    first, second = run2(fn, transport)
    assert second["recv"] == [5.0, 6.0] and second["bytes"] == [7, 8]
    for rank, out in enumerate([first, second]):
        assert out["all_gather"] == [[0.0, 0.0], [1.0, 1.0]]
        assert out["all_gather_into_tensor"] == [0.0, 0.0, 1.0, 1.0]
        assert out["scatter"] == [float(rank)] * 2
        assert out["reduce_scatter"] == [2.0 * (rank + 1)] * 2
