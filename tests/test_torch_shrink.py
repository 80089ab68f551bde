"""pydist.torch.shrink_group: torch.distributed on the pydist plugin loses a rank (rank 0,
the host of torch's store, too), shrinks, rebuilds torch DDP and makes new groups; and why
torch's own shrink_group cannot serve a Python backend (harness: run_scripts/shrink_ranks.py)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from run_scripts import shrink_ranks  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("victim", [2, 0], ids=["rank 2", "rank 0 (torch's store host)"])
def test_torch_survivors_shrink_rebuild_ddp_and_make_groups(victim):
    trial = shrink_ranks.shrink_trial(3, [victim], delay=0.3, target=shrink_ranks.torch_shrink_rank)
    assert not shrink_ranks.problems(trial), shrink_ranks.problems(trial)
    reports = [trial["reports"][r] for r in range(3) if r != victim]
    assert [r["world_rank"] for r in reports] == [0, 1] and all(r["world_size"] == 2 for r in reports)
    assert all(r["new_group_sum"] == 2.0 for r in reports)
    assert reports[0]["grad"] == reports[1]["grad"]  # DDP on the shrunk group averaged the gradients


def test_torch_cannot_register_a_python_backend_for_its_own_shrink_group():
    """Why pydist.torch.shrink_group exists: torch.distributed.shrink_group registers the
    shrunk backend as a c10d::Backend, which Python cannot construct. If this starts to pass
    construction, torch's own path may work for a Python backend: revisit."""
    from torch._C._distributed_c10d import Backend

    class PythonBackend(Backend):
        def __init__(self):
            super().__init__(0, 1)

    with pytest.raises(TypeError, match="No constructor defined"):
        PythonBackend()
