"""Entries another local user could plant in /dev/shm, for the adversarial tests."""
import os
from collections.abc import Iterator
from contextlib import contextmanager

#: another user's uid for the files planted as "theirs" (nobody)
OTHER_UID = 65534


@contextmanager
def planted(paths: dict[str, str]) -> Iterator[dict[str, str]]:
    """Make each entry of ``paths`` as its key says: "directory", "other user's" (a file of
    OTHER_UID), "symlink" (to a file of this test), anything else an empty file of this
    user; removed at exit."""
    target = f"/dev/shm/pydist-test-link-target-{os.getpid()}"
    with open(target, "wb") as file:
        file.write(b"x")
    try:
        for what, path in paths.items():
            if what == "directory":
                os.mkdir(path)
            elif what == "symlink":
                os.symlink(target, path)
            else:
                with open(path, "wb") as file:
                    file.write(b"\0" * 4096 if what == "other user's" else b"")
                if what == "other user's":
                    os.chown(path, OTHER_UID, OTHER_UID)
        yield paths
    finally:
        for path in [*paths.values(), target]:
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            elif os.path.lexists(path):
                os.unlink(path)
