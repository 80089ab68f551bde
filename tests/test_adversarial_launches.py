"""Issue 46, attack 2, end to end under each way of starting a job: another local user swaps
a new group's shared memory through the job's store while the job runs.

The job: 2 ranks on this host (tests/run_scripts/shm_swap_rank.py) make ``new_group([0, 1])``
and all_reduce on it; rank 1 reads the name of the group's first segment only once the
attacker (this test) has rewritten it. The attacker does what another local user can: it
opens the job's store with no secret (torch's own client for torchrun's agent store, pydist's
for a store that pydist serves), finds the key among the store's keys, and writes the name
of a file of its own in /dev/shm (owned by uid 65534, mode 0666, the size of the real
segment), or the "unavailable" mark, or (with a secret) a segment of the job's user that
pydist sealed for this very group and world without the secret. On ab324a2 the first made
rank 1 compute with the attacker's memory (262,850 wrong all_reduce results in 60 s under
torchrun with a token). Now, per launch:

- pydist-run (its per-job secret) and env:// with PYDIST_AUTH_TOKEN: the outsider cannot open
  the store; the job computes the right result;
- torchrun with a token (torch's agent store stays open): every swap is refused by rank 1
  at once, naming the segment and why; no result is computed;
- torchrun without a token, env:// without one, mpiexec: another user's segment is refused
  the same way; the "unavailable" mark (which only a secret can authenticate) stops the
  group at its timeout with an error on both ranks; no result either way.
"""
from __future__ import annotations

import json
import os
import secrets
from datetime import timedelta
from pathlib import Path

import pytest
from launch_ways import skip_unless_available, start, wait_for

from pydist.net.auth import AuthenticationError
from pydist.testing import commands
from pydist.transport.shm import atomics as _atomics
from pydist.transport.shm.seal import SEAL_BYTES, Binding
from pydist.transport.shm.segment import Segment, remove_stale

pytestmark = [pytest.mark.adversarial, pytest.mark.slow,  # two real ranks under a launcher each
              pytest.mark.skipif(not _atomics.available(), reason="no libatomic/futex: shared memory is off"),
              pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file of another user")]

SCRIPT = str(Path(__file__).parent / "run_scripts" / "shm_swap_rank.py")
OTHER_UID = 65534  # nobody: the attacker
SECONDS = 90  # every wait's bound: generous (a loaded machine), under pytest-timeout's 120 s
GROUP_TIMEOUT = "10"  # the job's group timeout (s): what a stalled group waits


def _open_store(launch: str, host: str, port: int):
    """The job's store as an outsider opens it: no secret."""
    if launch.startswith("torchrun"):  # torchrun's agent store: torch's C++ TCPStore
        import torch.distributed as tdist
        return tdist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30))
    from pydist import TCPStore
    return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=30), auth_token="")


class _Attacker:
    """Rewrites the name published under a relative ``key`` in an open store; what it made is
    removed by ``clean``."""

    def __init__(self, store, key: str):
        self.store = store
        # the group's key (the world's own segments have keys that end alike, all attached)
        [self.key] = [k for k in store.list_keys() if k.endswith(key) and not self._attached_by_all(k)]
        self.real = store.get(self.key).decode()
        self.size = os.stat(f"/dev/shm/{self.real}").st_size  # sizes in /dev/shm are visible to all
        self.relative = key.removesuffix("/name")
        self.purpose = self.relative.split("/")[1]
        self.made: list = []

    def _attached_by_all(self, key: str) -> bool:
        attached = key.removesuffix("name") + "attached"
        return bool(self.store.check([attached])) and int(self.store.get(attached)) >= 2

    def another_users_segment(self) -> str:
        name = f"pydist-{'0' * 12}-{self.purpose}-{secrets.token_hex(16)}-{os.getpid()}"
        fd = os.open(f"/dev/shm/{name}", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        self.made.append(f"/dev/shm/{name}")
        os.ftruncate(fd, self.size)
        os.fchmod(fd, 0o666)  # the attacker reads and writes it
        os.fchown(fd, OTHER_UID, OTHER_UID)
        os.close(fd)
        return name

    def sealed_without_the_secret(self) -> str:
        """A segment of the job's user, sealed by pydist for this group and world: it passes
        every check but the secret (shown by attaching it without one)."""
        world = self.store.get(self.key.removesuffix(self.relative + "/name") + "tcp/token").decode()
        binding = Binding(self.relative, world, self.size - SEAL_BYTES, None)
        segment = Segment.create(world, self.purpose, binding)
        self.made.append(segment)
        Segment.attach(segment.name, binding).close()  # right for a job without a secret
        return segment.name

    def clean(self) -> None:
        for made in self.made:
            if isinstance(made, Segment):
                made.unlink()
                made.close()
            elif os.path.lexists(made):
                os.unlink(made)


def _run_attack(launch: str, attack: str, tmp_path: Path, **extra: str) -> tuple[str, dict, dict]:
    """Start the job, attack when rank 1 is about to read the name, let it go on: (what the
    attacker did, rank 0's outcome, rank 1's); ``extra``: the ranks' environment beyond."""
    skip_unless_available(launch)
    signals = tmp_path / "signals"
    signals.mkdir()
    api = "torch" if launch.startswith("torchrun") else "pydist"
    procs = start(launch, [SCRIPT, api, str(signals)], **{"SWAP_TIMEOUT": GROUP_TIMEOUT, **extra})
    attacker = None
    try:
        host, port = wait_for(signals / "store", procs, SECONDS).split()
        key = wait_for(signals / "published", procs, SECONDS)
        try:
            store = _open_store(launch, host, int(port))
        except AuthenticationError:
            did = "refused by the store"
        else:
            attacker = _Attacker(store, key)
            value = {"another user's segment": attacker.another_users_segment,
                     "sealed without the secret": attacker.sealed_without_the_secret,
                     "unavailable mark": lambda: "unavailable"}[attack]()
            store.set(attacker.key, value)
            did = f"wrote {value}"
        (signals / "go").write_text("")
        done = commands.finish(procs, SECONDS)
        outcomes = [json.loads((signals / f"rank{rank}.json").read_text()) if (signals / f"rank{rank}.json").exists()
                    else {"error": f"no outcome; the launcher said:\n{done[0].stderr[-2000:]}"} for rank in range(2)]
    finally:
        for proc in procs:
            commands.kill_group(proc)
        if attacker is not None:
            attacker.clean()
        commands.finish(procs, SECONDS)
        remove_stale()  # the segments a rank made for a member that refused them (their creator is gone)
    print(f"{launch}, {attack}: the attacker {did}; rank 0: {outcomes[0]}; rank 1: {outcomes[1]}")
    return did, outcomes[0], outcomes[1]


@pytest.mark.parametrize("launch", ["pydist-run", "env-token"])
def test_a_job_with_a_secret_in_its_store_keeps_the_outsider_out(launch, tmp_path):
    did, rank0, rank1 = _run_attack(launch, "another user's segment", tmp_path)
    assert did == "refused by the store"
    assert rank0 == rank1 == {"result": [3.0]}


def _refused(rank0: dict, rank1: dict, words: str) -> None:
    """Rank 1 refused the segment, naming it and why; no rank computed anything."""
    assert "result" not in rank0 and "result" not in rank1, (rank0, rank1)
    assert "refusing the shared memory named under store key" in rank1["error"] and words in rank1["error"], rank1


@pytest.mark.parametrize("launch", ["torchrun-token", "torchrun", "env", "mpiexec"])
def test_another_users_segment_swapped_through_an_open_store_is_refused(launch, tmp_path):
    did, rank0, rank1 = _run_attack(launch, "another user's segment", tmp_path)
    assert did.startswith("wrote pydist-")
    _refused(rank0, rank1, f"{did.removeprefix('wrote ')}: it is owned by uid {OTHER_UID}")


LONG_GROUP_TIMEOUT = 60  # seconds: the peers' errors must come from the refusal, well before it


@pytest.mark.parametrize("launch, at", [("torchrun", "new_group"), ("torchrun", "init"), ("env", "init")])
def test_the_peers_of_a_rank_that_refuses_a_segment_fail_at_once_naming_it(launch, at, tmp_path):
    """The refusing rank tells its peers why: rank 0 fails at once, naming rank 1's refusal of
    the segment (GroupAbortedError), not at the group's timeout with "has not reached this
    operation or is stuck". Gated at a torch new_group (once a private world of its own, whose
    ring segment was refused while it was made) and at init (the host's ring segment)."""
    did, rank0, rank1 = _run_attack(launch, "another user's segment", tmp_path, SWAP_AT=at,
                                    SWAP_TIMEOUT=str(LONG_GROUP_TIMEOUT))
    words = f"{did.removeprefix('wrote ')}: it is owned by uid {OTHER_UID}"
    _refused(rank0, rank1, words)
    assert "failed and aborted the group: refusing the shared memory named under store key" in rank0["error"], rank0
    assert words in rank0["error"], rank0
    # the group's timeout is what the old code waited for; the abort comes within seconds
    assert rank0["seconds"] < LONG_GROUP_TIMEOUT, rank0


def test_under_torchrun_with_a_token_a_segment_sealed_without_it_is_refused(tmp_path):
    """torch's agent store is open even with a token: the seal's MAC with the secret is what
    refuses a segment of the job's own user made for this group without it."""
    did, rank0, rank1 = _run_attack("torchrun-token", "sealed without the secret", tmp_path)
    _refused(rank0, rank1, f"{did.removeprefix('wrote ')}: its seal is not this job's")


def test_under_torchrun_with_a_token_a_forged_unavailable_mark_is_refused(tmp_path):
    did, rank0, rank1 = _run_attack("torchrun-token", "unavailable mark", tmp_path)
    assert did == "wrote unavailable"
    _refused(rank0, rank1, "'unavailable' is not a pydist segment name")


@pytest.mark.parametrize("launch", ["torchrun", "env"])
def test_without_a_secret_a_forged_unavailable_mark_stops_the_group_with_no_result(launch, tmp_path):
    """The limit of a job without a secret: rank 1 goes without the segment, rank 0 uses it;
    the group stops (an error on each rank, at its timeout at the latest), no result."""
    did, rank0, rank1 = _run_attack(launch, "unavailable mark", tmp_path)
    assert did == "wrote unavailable"
    assert "error" in rank0 and "error" in rank1, (rank0, rank1)
