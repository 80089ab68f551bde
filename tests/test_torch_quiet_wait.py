"""Issue 41 (item 5): a rank waiting for a late peer prints nothing.

torch's TCPStore client logs two C++ warnings ("waitForInput: poll for socket ... returned 0,
likely a timeout", "... timed out after 100ms") each time a ``wait`` of it expires. pydist
once waited for the creator of a group's shared memory with 0.1 s waits in a loop, so under
torch's store (the torch plugin, or pydist's API under torchrun) a rank waiting for a late
rank 0 printed two lines per 100 ms: a minute of data loading on rank 0 made ~1,200 lines.
gloo prints none. Each case here runs 2 ranks whose rank 0 comes LATE_SECONDS late to a
new group (a default group's arena is made inside init_process_group, where both ranks are
on time), and checks the sum and that no such line came out. The new group's arena is made
at its first all_reduce, with pydist's API and through the torch plugin alike (a torch
new_group is a group of the default group's world): rank 1 waits there for rank 0 to
create its segment (sharing._wait_for_name, the path that printed). Under torch, rank 0
comes late to ``new_group`` itself (which, in torch's default, meets nobody), under pydist
to the all_reduce.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pydist.core.deadline import Deadline
from pydist.core.errors import DistBackendError
from pydist.groups import admission
from pydist.testing.commands import run_command
from pydist.transport.shm.sharing import _wait_for_name

tdist = pytest.importorskip("torch.distributed")
from pydist.torch._store import TorchStore  # noqa: E402  (after the skip: it imports torch)

LATE_SECONDS = 1.5  # 15 of the old 0.1 s polls: 30 lines before the fix
COMMAND_TIMEOUT = 240.0  # seconds; a loaded 2-core machine starts two torch processes in a few seconds
NOISE = ("waitForInput", "timed out after")

PROGRAM = f'''
import json, os, sys, time
api = sys.argv[1]
if api == "torch":
    import torch.distributed as dist
    import torch
    dist.init_process_group("pydist")
    def value(rank):
        return torch.arange(4.0) + rank
    def listed(tensor):
        return tensor.tolist()
else:
    import numpy as np
    import pydist as dist
    dist.init_process_group("pydist")
    def value(rank):
        return np.arange(4.0) + rank
    def listed(array):
        return array.tolist()
rank = dist.get_rank()
late = {LATE_SECONDS} if rank == 0 else 0  # data loading, a checkpoint read: rank 1 waits for rank 0
if api == "torch":
    time.sleep(late)  # rank 1 goes on to the all_reduce, and waits there for the arena
pair = dist.new_group([0, 1])
if api != "torch":
    time.sleep(late)  # rank 1 waits at the all_reduce, for the arena rank 0 creates
tensor = value(rank)
dist.all_reduce(tensor, group=pair)
os.write(1, ("RESULT %d %s\\n" % (rank, json.dumps(listed(tensor)))).encode())  # one write: torchrun runs ranks with -u
dist.destroy_process_group()
'''

LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"],
    "pydist-run": [sys.executable, "-m", "pydist.run", "--nproc-per-node", "2"],
}


def run_late(tmp_path: Path, launcher: str, api: str, shm: bool) -> str:
    """Run PROGRAM on 2 ranks; assert it succeeded with the right sum; its stdout + stderr."""
    script = tmp_path / "late.py"
    script.write_text(PROGRAM)
    env = {**os.environ, "PYDIST_SHM": "1" if shm else "0", "OMP_NUM_THREADS": "1",
           "TORCH_CPP_LOG_LEVEL": "WARNING"}  # torch's default: its warnings are shown
    run = run_command(LAUNCHERS[launcher] + [str(script), api], timeout=COMMAND_TIMEOUT, env=env, cwd=tmp_path)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    results = sorted(line.split("RESULT ", 1)[1] for line in output.splitlines() if "RESULT " in line)
    assert results == ["0 [1.0, 3.0, 5.0, 7.0]", "1 [1.0, 3.0, 5.0, 7.0]"], output
    return output


class CountingStore:
    """A torch store (wrapped as the plugin wraps it) that counts the waits made on it."""

    def __init__(self):
        self.store = TorchStore(tdist.HashStore())
        self.waits = 0

    def wait(self, *args):
        self.waits += 1
        return self.store.wait(*args)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_waiting_with_liveness_checks_looks_without_waiting_on_the_store():
    """With ``alive`` (an arena's first collective) the waiting rank checks the store and
    pauses: no wait of torch's store expires, so torch logs nothing however long it takes."""
    store, looks = CountingStore(), []

    def alive():
        looks.append(1)
        if len(looks) == 5:  # the creator comes while the rank waits
            store.set("arena/name", "segment")
    _wait_for_name(store, "arena/name", 0, Deadline.after(60), alive)
    assert store.waits == 0 and len(looks) == 5


def test_a_member_found_dead_while_waiting_ends_the_wait():
    store = CountingStore()

    def alive():
        raise DistBackendError("rank 0 is gone")
    with pytest.raises(DistBackendError, match="rank 0 is gone"):
        _wait_for_name(store, "arena/name", 0, Deadline.after(60), alive)
    assert store.waits == 0


def test_a_joiner_waiting_for_its_decision_looks_without_waiting_on_the_store():
    """A replacement under the torch plugin (PYDIST_JOIN=1) waits through torch's store until
    the members admit it, at a step boundary of theirs: seconds, with no wait that expires."""
    store, looks = CountingStore(), []
    ticket = admission.Ticket(transport_rank=3, namespace="ns", size=3)

    def check(keys):
        looks.append(keys)
        if len(looks) == 7:  # the members decide while the joiner waits
            store.set("pydist/joiner/3/decision", '{"admitted": true}')
        return store.store.check(keys)
    store.check = check
    assert admission.await_decision(store, ticket, 60.0) == {"admitted": True}
    assert store.waits == 0


def noise_lines(output: str) -> list[str]:
    lines = [line for line in output.splitlines() if any(word in line for word in NOISE)]
    print(f"{len(lines)} lines of torch's store-timeout warnings", *lines[:4], sep="\n")
    return lines


@pytest.mark.parametrize("launcher, api", [("torchrun", "torch"), ("pydist-run", "torch"), ("torchrun", "pydist")])
@pytest.mark.slow  # real launchers starting processes that import torch
@pytest.mark.timeout(300)
def test_a_rank_waiting_for_a_late_rank_zero_prints_nothing(tmp_path, launcher, api):
    """Over shared memory (see the module docstring for where rank 1 waits)."""
    assert noise_lines(run_late(tmp_path, launcher, api, shm=True)) == []


@pytest.mark.slow  # real launchers starting processes that import torch
@pytest.mark.timeout(300)
def test_without_shared_memory_a_late_rank_zero_prints_nothing_either(tmp_path):
    assert noise_lines(run_late(tmp_path, "torchrun", "torch", shm=False)) == []
