"""The CPUs this job's ranks may use and its cgroup's CPU pressure, for the waits' rules (signal).

``os.cpu_count()`` is the machine's count, not what a process may run on: a CPU set
(``taskset``, Slurm's cpusets, ``docker --cpuset-cpus``) narrows it, and so does a cgroup
CPU quota (``docker --cpus``, Kubernetes limits: cgroup v2's ``cpu.max``, or cgroup v1's
``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` in the cpu controller's hierarchy, -1:
unlimited), which lets the cgroup run quota/period CPUs' worth of time per period and
throttles it for the rest of the period once spent. :func:`usable_cpus` is the smaller of
the two: the affinity mask's size, and the tightest quota of this process's cgroup and its
ancestors (in either version), rounded down (1.5 CPUs of quota cannot keep 2 spinning ranks
running), at least 1. The directory (in either version) is the process's cgroup path
(/proc/self/cgroup, relative to the hierarchy's root) under the hierarchy's mount (v2's, or
v1's cpu controller's), less the mount's own root (/proc/self/mountinfo: a container sees
its own cgroup, or its pod's, mounted as the hierarchy), up to the mount; none where the
cgroup is not under the mount's root.

A launcher that binds each rank to a core of its own (Open MPI's default for 2 ranks, ``srun
--cpu-bind=cores``) gives every rank a one-CPU mask, although the ranks run side by side: what
counts is the union of the masks of the ranks of a machine. :class:`CpuShare` finds it through
the job's store: a rank whose mask is narrower than the machine appends it, before the ranks
meet, to its machine's key; after they met (every rank's append is in), a rank that alone
has fewer CPUs than the machine's ranks reads the key. A rank that appended nothing has the
whole machine. (Through a network transport whose build is no barrier, an append may come
late and be read as the whole machine: the waits then spin as before this rule.)

Busy neighbours (:class:`Neighbours`, the rule of signal's LONG_YIELD): ``/proc/loadavg``
counts the whole host's runnable tasks; in a container on a busy node every wait would
believe it is beside busy processes. So the host's count is read only where the host is
this process's neighbourhood: in the root cgroup (no ``cgroup.type`` there; a container's
namespaced root has one), with every CPU in its mask and no quota. In any other cgroup v2
cgroup the rule reads this cgroup's CPU pressure (PSI ``cpu.pressure``, ``full total=``:
microseconds in which every runnable task of the cgroup waited for a CPU, i.e. tasks of
other cgroups held its CPUs, or its quota throttled it; its own crowded ranks never make
it, as one of them runs), or is off on a kernel without PSI; in the root cgroup with a CPU
mask or quota it is off. What it cannot see: busy processes inside the job's own cgroup (a
container's data loaders), as the host's count could where the job is the whole host; nor,
in a cgroup v1 container without a quota or CPU set, that the host is not the job's.

The parsers are pure (text in, value out) and the readers take the file reader as an
argument, so tests feed file contents. Any file missing, unreadable or malformed means "not
set": no quota, no pressure (None), never an error; so does a malformed entry in the store.
"""
from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterable
from typing import Any

Reader = Callable[[str], "str | None"]
#: Where cgroup v2 is mounted when /proc/self/mounts does not say (a pure v2 machine's mount).
DEFAULT_MOUNT = "/sys/fs/cgroup"
KEY = "shm/cpus/"  # + the machine: "rank:mask;" of each rank of it with a narrowed mask
MASK_DIGITS = 4096  # the most hex digits of a mask read (16,384 CPUs)


def read_text(path: str) -> str | None:
    """The file's text, or None when it cannot be read (missing, no permission, not text)."""
    try:
        with open(path, encoding="ascii") as file:
            return file.read(65536)
    except (OSError, ValueError):
        return None


def cgroup2_mount(mountinfo: str | None) -> tuple[str, str]:
    """(root within the hierarchy, mount point) of the cgroup v2 hierarchy in
    /proc/self/mountinfo's text (a hybrid machine mounts it at /sys/fs/cgroup/unified), else
    ("/", DEFAULT_MOUNT)."""
    return _mount(mountinfo, lambda kind, _: kind == "cgroup2") or ("/", DEFAULT_MOUNT)


def cgroup2_path(proc_self_cgroup: str | None) -> str | None:
    """This process's cgroup v2 path (``0::/path`` in /proc/self/cgroup's text), or None."""
    for line in (proc_self_cgroup or "").splitlines():
        if line.startswith("0::/"):
            return line[3:]
    return None


def cgroup1_cpu_path(proc_self_cgroup: str | None) -> str | None:
    """This process's cgroup v1 path in the cpu controller's hierarchy (``5:cpu,cpuacct:/path``
    in /proc/self/cgroup's text), or None."""
    for line in (proc_self_cgroup or "").splitlines():
        fields = line.split(":", 2)
        if len(fields) == 3 and "cpu" in fields[1].split(",") and fields[2].startswith("/"):
            return fields[2]
    return None


def cgroup1_cpu_mount(mountinfo: str | None) -> tuple[str, str] | None:
    """(root within the hierarchy, mount point) of the first cgroup v1 mount of the cpu
    controller in /proc/self/mountinfo's text (``id parent dev root point options [tags] -
    cgroup source super-options``, the super options naming the controllers), or None."""
    return _mount(mountinfo, lambda kind, options: kind == "cgroup" and "cpu" in options.split(","))


def _mount(mountinfo: str | None, wanted: Callable[[str, str], bool]) -> tuple[str, str] | None:
    """(root within the hierarchy, mount point) of the first mount in /proc/self/mountinfo's
    text whose file system type and super options are ``wanted``, or None."""
    for line in (mountinfo or "").splitlines():
        fields = line.split()
        dash = fields.index("-") if "-" in fields else -1
        if dash >= 6 and len(fields) >= dash + 4 and wanted(fields[dash + 1], fields[dash + 3]):
            return _unescaped(fields[3]), _unescaped(fields[4])
    return None


def _unescaped(field: str) -> str:
    """A mountinfo path field with its octal escapes (``\\040``: a space) undone."""
    return re.sub(r"\\([0-7]{3})", lambda found: chr(int(found[1], 8)), field)


def cpu_max_quota(cpu_max: str | None) -> float | None:
    """CPUs' worth of time ``cpu.max``'s text allows (``"150000 100000"`` -> 1.5); None when
    unlimited (``"max 100000"``) or malformed."""
    fields = (cpu_max or "").split()
    if len(fields) != 2 or not fields[0].isdigit() or not fields[1].isdigit() or int(fields[1]) == 0:
        return None
    return int(fields[0]) / int(fields[1])


def cfs_quota(quota_us: str | None, period_us: str | None) -> float | None:
    """CPUs' worth of time cgroup v1's ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us`` texts
    allow (``"150000"``, ``"100000"`` -> 1.5); None when unlimited (quota ``-1``) or malformed."""
    return cpu_max_quota(f"{(quota_us or '').strip()} {(period_us or '').strip()}")


def pressure_total(cpu_pressure: str | None, kind: str = "full") -> int | None:
    """``total=`` of the ``kind`` line ("some" or "full") of ``cpu.pressure``'s text
    (microseconds stalled), or None."""
    for line in (cpu_pressure or "").splitlines():
        fields = line.split()
        if fields[:1] == [kind]:
            for field in fields[1:]:
                if field.startswith("total=") and field[6:].isdigit():
                    return int(field[6:])
    return None


def cgroup_dirs(read: Reader = read_text) -> list[str]:
    """This process's cgroup v2 directory, then each ancestor up to the mount (empty where
    /proc/self/cgroup has no v2 line, or the process's cgroup is not under the mount's root)."""
    path = cgroup2_path(read("/proc/self/cgroup"))
    return [] if path is None else _up_to(cgroup2_mount(read("/proc/self/mountinfo")), path)


def cgroup1_cpu_dirs(read: Reader = read_text) -> list[str]:
    """This process's directory in the cgroup v1 cpu hierarchy, then each ancestor up to the
    mount (empty where there is no such hierarchy, no mount of it, or the process's cgroup
    is not under the mount's root)."""
    path = cgroup1_cpu_path(read("/proc/self/cgroup"))
    mount = cgroup1_cpu_mount(read("/proc/self/mountinfo"))
    return [] if path is None or mount is None else _up_to(mount, path)


def _up_to(mount: tuple[str, str], path: str) -> list[str]:
    """The directory of cgroup ``path`` (relative to the hierarchy's root) under ``mount``
    (root within the hierarchy, mount point), then each ancestor up to the mount point;
    empty where ``path`` is not under the mount's root."""
    root, point = mount[0].rstrip("/"), mount[1]
    if path != root and not path.startswith(root + "/"):
        return []
    parts = [part for part in path[len(root):].split("/") if part and part != ".."]
    return [posixpath.join(point, *parts[:depth]) for depth in range(len(parts), -1, -1)]


def cpu_quota(read: Reader = read_text) -> float | None:
    """The tightest CPU quota of this process's cgroup and its ancestors (a parent's binds its
    children too), cgroup v2's ``cpu.max`` or v1's CFS quota, in CPUs; None where none is set."""
    quotas = [cpu_max_quota(read(posixpath.join(directory, "cpu.max"))) for directory in cgroup_dirs(read)]
    quotas += [cfs_quota(read(posixpath.join(directory, "cpu.cfs_quota_us")),
                         read(posixpath.join(directory, "cpu.cfs_period_us"))) for directory in cgroup1_cpu_dirs(read)]
    return min((quota for quota in quotas if quota is not None), default=None)


def capped(cpus: int, quota: float | None) -> int:
    """``cpus`` capped by ``quota`` rounded down, at least 1."""
    return max(1, cpus if quota is None else min(cpus, int(quota)))


def affinity() -> set[int]:
    """The CPUs in this thread's affinity mask (every CPU where it cannot be read)."""
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def usable_cpus(read: Reader = read_text, mask: Callable[[], set[int]] = affinity) -> int:
    """CPUs this process may keep busy at once: its affinity mask, capped by cgroup quotas."""
    return capped(len(mask()), cpu_quota(read))


def running_beyond(ranks_here: int, loadavg: str | None) -> bool:
    """Whether /proc/loadavg's text counts more runnable tasks than the job's ranks here."""
    try:
        return int((loadavg or "").split()[3].split("/")[0]) > ranks_here
    except (ValueError, IndexError):
        return False


class Neighbours:
    """Whether busy processes beside the job took its CPUs lately (see the module docstring):
    ``how`` is "pressure" (this cgroup's PSI), "load" (the host's runnable count) or "off"."""

    def __init__(self, ranks_here: int, read: Reader = read_text, mask: Callable[[], set[int]] = affinity,
                 machine_cpus: int | None = None):
        self._ranks_here, self._read = ranks_here, read
        dirs = cgroup_dirs(read)
        self._pressure = posixpath.join(dirs[0], "cpu.pressure") if dirs else ""
        self._stalled = pressure_total(read(self._pressure)) if dirs else None
        if dirs and read(posixpath.join(dirs[0], "cgroup.type")) is not None:  # not the host's root cgroup
            self.how = "pressure" if self._stalled is not None else "off"  # (off: a kernel without PSI)
        elif len(mask()) >= (machine_cpus or os.cpu_count() or 1) and cpu_quota(read) is None:
            self.how = "load"
        else:
            self.how = "off"

    def busy(self, took: float) -> bool:
        """After a yield that took ``took`` seconds: was it beside busy processes? (pressure:
        the cgroup was fully stalled at least half that long since the last look)."""
        if self.how == "load":
            return running_beyond(self._ranks_here, self._read("/proc/loadavg"))
        if self.how == "off":
            return False
        stalled = pressure_total(self._read(self._pressure))
        if stalled is None or self._stalled is None:
            return False
        busy = stalled - self._stalled >= took * 500_000  # microseconds: half the yield
        self._stalled = stalled
        return busy


def entry(rank: int, cpus: Iterable[int]) -> str:
    """A rank's entry under its machine's key: ``rank:mask;`` (the mask in hex)."""
    return f"{rank}:{sum(1 << cpu for cpu in set(cpus)):x};"


def masks(text: str) -> dict[int, int]:
    """The entries of a machine's key, rank -> mask (a later entry of a rank wins; a
    malformed one is skipped)."""
    found = {}
    for item in text.split(";"):
        rank, _, mask = item.partition(":")
        if rank.isdigit() and 0 < len(mask) <= MASK_DIGITS and all(c in "0123456789abcdef" for c in mask):
            found[int(rank)] = int(mask, 16)
    return found


def union_size(found: dict[int, int], ranks: Iterable[int], machine_cpus: int) -> int:
    """CPUs the ``ranks`` may use together: the union of their masks in ``found``;
    ``machine_cpus`` where one has none (it appended nothing: its mask is the machine)."""
    union = 0
    for rank in ranks:
        if rank not in found:
            return machine_cpus
        union |= found[rank]
    return bin(union).count("1")


class CpuShare:
    """How many CPUs a machine's ranks may use together (see the module docstring): made
    before the ranks meet (it appends this rank's mask where narrowed), asked after."""

    def __init__(self, store: Any, machine: str, rank: int, read: Reader = read_text,
                 mask: Callable[[], set[int]] = affinity, machine_cpus: int | None = None):
        self._store, self._key, self._read = store, KEY + machine, read
        self._mask = mask()
        self._machine_cpus = machine_cpus or os.cpu_count() or 1
        self._narrowed = len(self._mask) < self._machine_cpus
        if self._narrowed:
            store.append(self._key, entry(rank, self._mask))

    def cpus(self, ranks: list[int]) -> int:
        """CPUs the machine's ``ranks`` (this one's included) may use together, capped by this
        process's cgroup quota; reads the store only where this rank alone has too few."""
        quota = cpu_quota(self._read)
        own = capped(len(self._mask), quota)
        if own >= len(ranks) or not self._narrowed:
            return own
        found = masks(self._store.get(self._key).decode("ascii", "replace"))
        return capped(union_size(found, ranks, self._machine_cpus), quota)
