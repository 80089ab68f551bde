"""pydist.torch.work.PydistWork's future: a failed operation fails the future where torch's C++
reads it (DDP's reducer, torch.futures.collect_all), not only in Python; torch's Python
``Future.set_exception`` stores the exception as the value, which C++ then reads as the
tensors (DDP's reducer crashed on it, SIGSEGV, when a peer died mid-backward)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pydist.core.errors import PeerFailedError  # noqa: E402
from pydist.groups.work import Work  # noqa: E402
from pydist.torch.work import PydistWork  # noqa: E402


def _failed_work() -> PydistWork:
    work = Work("all_reduce on group test")
    work._fail(PeerFailedError("rank 1 on host has not answered", rank=1))
    return PydistWork(work, [torch.ones(2)])


@pytest.mark.filterwarnings("ignore:.*Work::exception API is being deprecated")
@pytest.mark.filterwarnings("ignore:.*Work::is_success API is being deprecated")
def test_a_failed_operation_fails_its_future_for_torchs_cpp_readers():
    from torch._C._distributed_c10d import _create_work_from_future
    cpp_view = _create_work_from_future(_failed_work().get_future())  # a C++ Work reading the future
    cpp_view.wait()
    assert not cpp_view.is_success()  # a future given the exception as its value would succeed
    try:
        error = cpp_view.exception()
    except TypeError as e:  # torch 2.11 cannot convert the C++ exception_ptr to Python
        assert "Unable to convert function return value" in str(e)
    else:
        assert "rank 1 on host has not answered" in str(error)


def test_a_failed_operation_raises_from_the_future_in_python_naming_pydists_error():
    """As torch's own backends' futures do, it raises a RuntimeError (torch's C++ wraps the
    error); its text names pydist's error; ``Work.wait()`` raises pydist's error itself."""
    with pytest.raises(RuntimeError, match="PeerFailedError: rank 1 on host has not answered"):
        _failed_work().get_future().wait()
    with pytest.raises(PeerFailedError, match="rank 1 on host has not answered"):
        _failed_work().wait()


def test_a_done_operation_resolves_its_future_to_the_outputs():
    work = Work("all_reduce on group test")
    work._succeed()
    outputs = [torch.full((2,), 3.0)]
    assert PydistWork(work, outputs).get_future().wait()[0].tolist() == [3.0, 3.0]
