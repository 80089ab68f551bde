"""Attack: a segment swapped through the store. Whoever can write a job's store (an open
job's, torchrun's agent store) overwrites the name a group's creator published under
``.../shm/arena/<group id>/<members>/name`` with a segment of their own. A member must refuse
it, with an error naming the segment and why, before touching any slot: never map it and
compute with it. The attacker's segment has the size of a real one (sizes in /dev/shm are
visible to everyone)."""
import os
import re
import threading

import numpy as np
import pytest

import pydist as dist
from pydist.core.deadline import Deadline
from pydist.testing import run_threads
from pydist.testing.threads import RankFailed
from pydist.transport.shm import atomics as _atomics
from pydist.transport.shm.sharing import share

pytestmark = [pytest.mark.adversarial,
              pytest.mark.skipif(not _atomics.available(), reason="no libatomic/futex: shared memory is off")]

OTHER_UID = 65534  # nobody: the "other user" of these tests (they run as root, who can chown)
KEY = "shm/arena/5eed/0,1"
WORLD = "0123456789abcdef"
PAYLOAD = 8192


def _evil_name(tag: str) -> str:
    return f"pydist-{WORLD[:12]}-arena-{tag * 32}-{os.getpid()}"


@pytest.fixture
def attack():
    """Make the creator's real segment (rank 0 of [0, 1]) and give the attacker's tools:
    ``attack.plant(name, ...)`` makes a file the size of the real one; removed at teardown."""
    store = dist.HashStore()
    real = share(store, KEY, [0, 1], 0, PAYLOAD, WORLD, "arena", Deadline.after(5))
    size = os.stat(f"/dev/shm/{real.name}").st_size
    planted = []

    class Attack:
        def __init__(self):
            self.store, self.real, self.size = store, real, size

        def plant(self, name: str, uid: int = 0, mode: int = 0o600, content: bytes = b"") -> str:
            path = f"/dev/shm/{name}"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
            os.write(fd, content.ljust(size, b"\x7f"))
            os.fchmod(fd, mode)
            os.fchown(fd, uid, uid)
            os.close(fd)
            planted.append(path)
            return name

        def swap(self, name: str) -> None:
            self.store.set(f"{KEY}/name", name)

    yield Attack()
    real.unlink()
    real.close()
    for path in planted:
        if os.path.lexists(path):
            os.unlink(path)


def _attach(attack):
    segment = share(attack.store, KEY, [0, 1], 1, PAYLOAD, WORLD, "arena", Deadline.after(5))
    segment.close()  # reached only when mapped: the test then fails on the missing error
    return segment


def test_another_users_segment_is_refused(attack):
    name = _evil_name("a")
    attack.swap(attack.plant(name, uid=OTHER_UID))
    with pytest.raises(dist.DistStoreError, match=f"{KEY}/name.*{name}: it is owned by uid {OTHER_UID}"):
        _attach(attack)


def test_a_segment_other_users_may_write_is_refused(attack):
    name = _evil_name("b")
    attack.swap(attack.plant(name, mode=0o666))
    with pytest.raises(dist.DistStoreError, match=f"{name}: its mode 0666 lets other users in"):
        _attach(attack)


def test_a_symbolic_link_is_not_followed(attack):
    """A link in /dev/shm (anyone may make one) to a file of this user of the right size."""
    target = attack.plant(_evil_name("c"))
    name = _evil_name("d")
    os.symlink(f"/dev/shm/{target}", f"/dev/shm/{name}")
    try:
        attack.swap(name)
        with pytest.raises(dist.DistStoreError, match=f"{name}: it is a symbolic link"):
            _attach(attack)
    finally:
        os.unlink(f"/dev/shm/{name}")


def test_a_name_outside_dev_shm_is_refused(attack):
    attack.swap("../../etc/passwd")
    with pytest.raises(dist.DistStoreError, match="'../../etc/passwd' is not a pydist segment name"):
        _attach(attack)


def test_this_users_unsealed_segment_is_refused(attack):
    """Same owner, mode 0600, right size, but not made by pydist for this group."""
    name = _evil_name("e")
    attack.swap(attack.plant(name))
    with pytest.raises(dist.DistStoreError, match=f"{name}: it carries no pydist seal"):
        _attach(attack)


def test_another_groups_segment_of_this_user_is_refused(attack):
    """A real pydist segment of the same size, made for another group (or job): the seal
    binds the group's key and the world token, secret or not."""
    other = share(attack.store, "shm/arena/0ther/0,1", [0, 1], 0, PAYLOAD, WORLD, "arena", Deadline.after(5))
    try:
        attack.swap(other.name)
        with pytest.raises(dist.DistStoreError, match=f"{other.name}: its seal is for another group or job"):
            _attach(attack)
    finally:
        other.unlink()
        other.close()


def test_with_a_secret_a_segment_sealed_without_it_is_refused(attack, monkeypatch):
    """The job has a secret: a segment of this user that pydist sealed for this very group
    and world, but without the secret (another job of the user's, or a process that read the
    store), is refused."""
    forged = share(dist.HashStore(), KEY, [0, 1], 0, PAYLOAD, WORLD, "arena", Deadline.after(5))
    try:
        attack.swap(forged.name)
        monkeypatch.setenv("PYDIST_AUTH_TOKEN", "s3cret-of-the-job")
        with pytest.raises(dist.DistStoreError, match=f"{forged.name}: its seal is not this job's"):
            _attach(attack)
    finally:
        forged.unlink()
        forged.close()


@pytest.mark.parametrize("secret", [None, "s3cret-of-the-job"], ids=["no secret", "secret"])
def test_the_real_segment_is_mapped(secret, monkeypatch):
    if secret is not None:
        monkeypatch.setenv("PYDIST_AUTH_TOKEN", secret)
    store = dist.HashStore()
    real = share(store, KEY, [0, 1], 0, PAYLOAD, WORLD, "arena", Deadline.after(5))
    member = share(store, KEY, [0, 1], 1, PAYLOAD, WORLD, "arena", Deadline.after(5))
    try:
        member.array[:4] = 7
        assert list(real.array[:4]) == [7, 7, 7, 7]
        assert not os.path.exists(f"/dev/shm/{real.name}")  # unlinked by the last to attach
    finally:
        member.close()
        real.close()


def test_a_name_taken_first_is_skipped_for_a_fresh_one(monkeypatch):
    """Creation is exclusive: when the name drawn is taken (a squatter's file, or a link
    to a file of this user), the creator draws another and leaves the squatter's alone."""
    from pydist.transport.shm import segment as segment_module
    from pydist.transport.shm.names import segment_name
    squatted = _evil_name("9")
    with open(f"/dev/shm/{squatted}", "wb") as file:
        file.write(b"theirs")
    drawn = iter([squatted])
    monkeypatch.setattr(segment_module, "segment_name", lambda token, purpose: next(drawn, None)
                        or segment_name(token, purpose))
    try:
        made = share(dist.HashStore(), KEY, [0, 1], 0, PAYLOAD, WORLD, "arena", Deadline.after(5))
        assert made.name != squatted and made.name.endswith(f"-{os.getpid()}")
        with open(f"/dev/shm/{squatted}", "rb") as file:
            assert file.read() == b"theirs"
        made.unlink()
        made.close()
    finally:
        os.unlink(f"/dev/shm/{squatted}")


# -- a running job: the swap between the creator's publication and a member's read ------------
_created = threading.Event()


def _swapped_new_group(rank, size, name, check=None):
    """Rank 0 makes a new group (its arena's creator); then the attacker overwrites the
    published name; then rank 1 makes the group and runs an all_reduce on it."""
    from pydist.groups.world import current, group_digest
    world = current()
    if rank == 0:
        group = dist.new_group([0, 1])
        _created.set()
    else:
        assert _created.wait(30)
        count = world.group_counts[(0, 1)] + 1
        key = f"shm/arena/{group_digest(f'{world.generation}:0,1:{count}'):x}/0,1/name"
        if name.startswith("pydist-"):  # the attacker's segment: the size of the real one
            os.truncate(f"/dev/shm/{name}", os.stat(f"/dev/shm/{world.store.get(key).decode()}").st_size)
        world.store.set(key, name)
        group = dist.new_group([0, 1])
    x = np.full(64, rank + 1.0)
    dist.all_reduce(x, group=group)
    if check is not None:  # reached only with a right result
        assert x.tolist() == [3.0] * 64
    return x.tolist()


def test_a_swap_in_a_running_job_is_refused_with_an_error_naming_the_segment():
    """0 wrong results: rank 1 refuses the attacker's segment (another user's) with an
    error naming it and why, and no rank returns a result computed through it."""
    _created.clear()
    name = _evil_name("f")
    path = f"/dev/shm/{name}"
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    os.chown(path, OTHER_UID, OTHER_UID)
    try:
        with pytest.raises(RankFailed) as failed:
            run_threads(2, _swapped_new_group, name, transport="tcp", pg_timeout=10)
        assert f"{name}: it is owned by uid {OTHER_UID}" in str(failed.value)
    finally:
        os.unlink(path)


@pytest.mark.slow
def test_without_a_secret_a_forged_unavailable_mark_stops_the_group_without_a_wrong_result():
    """The limit of a job without a secret (docs/guide/security.md, "Shared memory"): an
    outsider who writes the store can tell one member that the creator found no room, so
    that member goes without the arena while the creator uses it. The group then stops at
    its first collective, at its timeout (the arena's barrier needs every member): one rank
    times out waiting for the other, which raises that or the abort it is told of; an error
    on each rank, no result at all (wrong or right)."""
    _created.clear()
    with pytest.raises(RankFailed) as failed:
        run_threads(2, _swapped_new_group, "unavailable", True, transport="tcp", pg_timeout=3)
    errors = str(failed.value).splitlines()
    assert len(errors) == 2 and "OpTimeoutError: all_reduce (seq 1)" in errors[0], errors
    assert re.match(r"\s*rank 1: (OpTimeoutError|GroupAbortedError): all_reduce \(seq 1\)", errors[1]), errors
