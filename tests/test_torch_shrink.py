"""pydist.torch.shrink_group: torch.distributed on the pydist plugin loses a rank (rank 0,
the host of torch's store, too), shrinks, rebuilds torch DDP and makes new groups; and that
torch's own shrink_group refuses a pydist group (harness: run_scripts/shrink_ranks.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from run_scripts import shrink_ranks  # noqa: E402

from pydist.torch.regroup import regrouping_supported  # noqa: E402


@pytest.mark.skipif(regrouping_supported(), reason="this torch has the internals")
def test_on_a_torch_without_the_internals_shrink_and_grow_name_the_torch():
    import re

    import pydist.torch
    for call, name in [(lambda: pydist.torch.shrink_group([1]), "pydist.torch.shrink_group"),
                       (pydist.torch.admit_joiners, "pydist.torch.admit_joiners")]:
        with pytest.raises(RuntimeError, match=re.escape(f"{name}: this torch ({torch.__version__}) lacks")):
            call()


@pytest.mark.slow
@pytest.mark.skipif(not regrouping_supported(), reason="this torch lacks the internals (see the test above)")
@pytest.mark.parametrize("victim", [2, 0], ids=["rank 2", "rank 0 (torch's store host)"])
def test_torch_survivors_shrink_rebuild_ddp_and_make_groups(victim):
    trial = shrink_ranks.shrink_trial(3, [victim], delay=0.3, target=shrink_ranks.torch_shrink_rank)
    assert not shrink_ranks.problems(trial), shrink_ranks.problems(trial)
    reports = [trial["reports"][r] for r in range(3) if r != victim]
    assert [r["world_rank"] for r in reports] == [0, 1] and all(r["world_size"] == 2 for r in reports)
    assert all(r["new_group_sum"] == 2.0 for r in reports)
    assert reports[0]["grad"] == reports[1]["grad"]  # DDP on the shrunk group averaged the gradients


def _torch_shrinks(rank, size):
    """torch.distributed.shrink_group, then pydist.torch.shrink_group, on a pydist group."""
    import torch.distributed as tdist

    import pydist.torch
    with pytest.raises(TypeError, match="does not support shrinking operations"):
        tdist.shrink_group([2])
    if rank == 2:
        return None
    shrunk = pydist.torch.shrink_group([2])
    t = torch.ones(1)
    tdist.all_reduce(t, group=shrunk)
    return shrunk.size(), t.item()


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(torch.distributed, "shrink_group"), reason="this torch has no shrink_group")
def test_torch_shrink_group_refuses_a_pydist_group_and_pydists_shrinks_it():
    """Why pydist.torch.shrink_group exists: torch.distributed.shrink_group asks the group's
    CPU backend (``_get_backend(cpu)``: the plugin's group itself) whether it shrinks, and
    registers what its ``shrink`` returns as a C++ ``c10d::Backend``. pydist's group is a
    ProcessGroup, not a Backend (a Python Backend cannot even be constructed before torch
    2.14), so torch refuses it, as it refuses gloo, on every torch that has shrink_group."""
    from pydist.testing import run_processes
    assert run_processes(3, _torch_shrinks, init="torch", timeout=180) == [(2, 2.0), (2, 2.0), None]
