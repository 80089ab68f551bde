"""The CPUs a job's ranks may use (CPU sets, cgroup v1 and v2 quotas, per-rank binding) and its
cgroup's CPU pressure, read from file contents the tests feed (pydist.transport.shm.cpus)."""
from __future__ import annotations

import functools
import os
import subprocess
import sys

import pytest

from pydist.store import HashStore
from pydist.testing.processes import free_port
from pydist.transport.shm import cpus
from pydist.transport.shm.cpus import CpuShare

#: a hybrid machine's mounts: cgroup v1 controllers, and v2 at /sys/fs/cgroup/unified
HYBRID_MOUNTINFO = """32 31 0:29 / /sys/fs/cgroup/cpu rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:13 - cgroup2 cgroup2 rw
"""
PRESSURE = """some avg10=12.50 avg60=3.00 avg300=0.50 total=123456
full avg10=0.00 avg60=0.00 avg300=0.00 total=7
"""


def files(contents: dict[str, str]):
    """A reader of the given files' contents (None for any other path, as for a missing file)."""
    return contents.get


def test_the_parsers_read_what_the_kernel_writes_and_nothing_else():
    assert cpus.cgroup2_mount(HYBRID_MOUNTINFO) == ("/", "/sys/fs/cgroup/unified")
    pod = "30 25 0:26 /a\\040b /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    assert cpus.cgroup2_mount(pod) == ("/a b", "/sys/fs/cgroup")  # (\\040: a space)
    for unset in ("cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n",  # (/proc/self/mounts' format)
                  "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n", "", None):
        assert cpus.cgroup2_mount(unset) == ("/", cpus.DEFAULT_MOUNT), unset
    assert cpus.cgroup2_path("4:memory:/x\n0::/kubepods/pod1/c2\n") == "/kubepods/pod1/c2"
    assert cpus.cgroup2_path("4:cpu,cpuacct:/docker/abc\n") is None
    assert cpus.cpu_max_quota("150000 100000\n") == 1.5
    for unset in ("max 100000\n", "", None, "12 0", "-1 100000", "1 2 3", "a b"):
        assert cpus.cpu_max_quota(unset) is None, unset
    assert (cpus.pressure_total(PRESSURE, "some"), cpus.pressure_total(PRESSURE)) == (123456, 7)
    for unset in ("", None, "some avg10=0 total=5", "full avg10=1.0 total=x"):
        assert cpus.pressure_total(unset) is None, unset
    assert cpus.running_beyond(4, "0.50 0.40 0.30 5/300 123\n") and not cpus.running_beyond(4, "1 1 1 4/300 1")
    assert not cpus.running_beyond(0, None) and not cpus.running_beyond(0, "garbage")


def test_a_containers_quota_caps_the_cpus_and_the_tightest_ancestor_counts():
    read = files({"/proc/self/cgroup": "0::/kubepods/pod1/c2\n", "/proc/self/mountinfo": HYBRID_MOUNTINFO,
                  "/sys/fs/cgroup/unified/kubepods/pod1/c2/cpu.max": "max 100000\n",
                  "/sys/fs/cgroup/unified/kubepods/pod1/cpu.max": "250000 100000\n",
                  "/sys/fs/cgroup/unified/kubepods/cpu.max": "400000 100000\n",
                  })
    assert cpus.cpu_quota(read) == 2.5
    assert cpus.usable_cpus(read, mask=lambda: set(range(64))) == 2  # 2.5 CPUs cannot keep 3 ranks running
    assert cpus.usable_cpus(read, mask=lambda: {5}) == 1  # taskset -c 5


def test_no_cgroup_v2_or_no_quota_leaves_the_affinity_mask():
    assert cpus.usable_cpus(files({}), mask=lambda: {0, 1, 2}) == 3
    read = files({"/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/cpu.max": "max 100000\n"})
    assert cpus.cgroup_dirs(read) == ["/sys/fs/cgroup"] and cpus.usable_cpus(read, mask=lambda: {0, 1}) == 2
    assert cpus.usable_cpus(files({"/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/cpu.max": "50000 100000"}),
                            mask=lambda: {0, 1}) == 1  # half a CPU: still one


def test_a_cgroup_v2_mount_of_a_cgroup_below_the_root_is_that_cgroups_directory():
    """A container sharing the host's cgroup namespace, its pod's cgroup mounted as the
    hierarchy (mountinfo's root /kubepods/pod1): /proc/self/cgroup's path is relative to the
    hierarchy's root, so the container's directory is the mount's ctr, not kubepods/pod1/ctr."""
    mountinfo = "30 25 0:26 /kubepods/pod1 /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw\n"
    read = files({"/proc/self/cgroup": "0::/kubepods/pod1/ctr\n", "/proc/self/mountinfo": mountinfo,
                  "/proc/self/mounts": "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n",
                  "/sys/fs/cgroup/ctr/cpu.max": "150000 100000\n"})
    assert cpus.cgroup_dirs(read) == ["/sys/fs/cgroup/ctr", "/sys/fs/cgroup"]
    assert cpus.cpu_quota(read) == 1.5 and cpus.usable_cpus(read, mask=lambda: set(range(8))) == 1
    elsewhere = files({"/proc/self/cgroup": "0::/system.slice/x\n", "/proc/self/mountinfo": mountinfo})
    assert cpus.cgroup_dirs(elsewhere) == []  # a cgroup outside the mounted one: not under it


#: a cgroup v1 machine's mounts (the cpu and cpuacct controllers together, a separate cpuset)
V1_MOUNTINFO = """25 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
31 25 0:28 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
32 31 0:29 / /sys/fs/cgroup/cpuset rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,cpuset
33 31 0:30 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,memory
"""
V1_CGROUP = "11:memory:/docker/abc\n5:cpu,cpuacct:/docker/abc\n3:cpuset:/docker/abc\n1:name=systemd:/docker/abc\n"
V1_CPU = "/sys/fs/cgroup/cpu,cpuacct/"


def test_the_cgroup_v1_parsers_find_the_cpu_controllers_hierarchy():
    assert cpus.cgroup1_cpu_path(V1_CGROUP) == "/docker/abc"
    assert cpus.cgroup1_cpu_path("4:cpu:/a\n") == "/a" and cpus.cgroup1_cpu_path("2:cpuacct,cpu:/b\n") == "/b"
    for unset in ("3:cpuset:/x\n2:cpuacct:/y\n", "0::/kubepods/c1\n", "", None, "5:cpu,cpuacct\n"):
        assert cpus.cgroup1_cpu_path(unset) is None, unset
    assert cpus.cgroup1_cpu_mount(V1_MOUNTINFO) == ("/", "/sys/fs/cgroup/cpu,cpuacct")
    container = "90 80 0:30 /docker/abc /sys/fs/cgroup/cpu\\040x ro,nosuid master:10 - cgroup cgroup rw,cpuacct,cpu\n"
    assert cpus.cgroup1_cpu_mount(container) == ("/docker/abc", "/sys/fs/cgroup/cpu x")  # (\\040: a space)
    for unset in ("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n",  # (/proc/self/mounts' format)
                  "32 31 0:29 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n",
                  "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n", "", None, "- cgroup"):
        assert cpus.cgroup1_cpu_mount(unset) is None, unset
    assert cpus.cfs_quota("150000\n", "100000\n") == 1.5
    for unset in (("-1\n", "100000\n"), ("", "100000"), (None, None), ("150000", "0"), ("150000", None),
                  ("1.5", "1"), ("max", "100000")):
        assert cpus.cfs_quota(*unset) is None, unset


def test_a_cgroup_v1_containers_quota_caps_the_cpus_and_the_tightest_ancestor_counts():
    """Docker on a cgroup v1 host (no cgroup namespace): the process's path under the
    hierarchy's root, with its ancestors up to the mount."""
    read = files({"/proc/self/cgroup": V1_CGROUP, "/proc/self/mountinfo": V1_MOUNTINFO,
                  V1_CPU + "docker/abc/cpu.cfs_quota_us": "-1\n", V1_CPU + "docker/abc/cpu.cfs_period_us": "100000\n",
                  V1_CPU + "docker/cpu.cfs_quota_us": "250000\n", V1_CPU + "docker/cpu.cfs_period_us": "100000\n",
                  V1_CPU + "cpu.cfs_quota_us": "-1\n", V1_CPU + "cpu.cfs_period_us": "100000\n"})
    assert cpus.cgroup1_cpu_dirs(read) == [V1_CPU + "docker/abc", V1_CPU + "docker", V1_CPU.rstrip("/")]
    assert cpus.cpu_quota(read) == 2.5
    assert cpus.usable_cpus(read, mask=lambda: set(range(64))) == 2
    assert cpus.usable_cpus(read, mask=lambda: {5}) == 1


def test_a_cgroup_v1_mount_of_the_containers_own_cgroup_is_its_directory():
    """A container whose cpu hierarchy is mounted from its own cgroup (mountinfo's root
    /docker/abc): the mount is the process's directory; nothing above it is seen."""
    mountinfo = "90 80 0:30 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
    read = files({"/proc/self/cgroup": V1_CGROUP, "/proc/self/mountinfo": mountinfo,
                  V1_CPU + "cpu.cfs_quota_us": "50000\n", V1_CPU + "cpu.cfs_period_us": "100000\n"})
    assert cpus.cgroup1_cpu_dirs(read) == [V1_CPU.rstrip("/")]
    assert cpus.cpu_quota(read) == 0.5 and cpus.usable_cpus(read, mask=lambda: {0, 1, 2, 3}) == 1
    elsewhere = files({"/proc/self/cgroup": "5:cpu,cpuacct:/other\n", "/proc/self/mountinfo": mountinfo})
    assert cpus.cgroup1_cpu_dirs(elsewhere) == []  # a cgroup outside the mounted one: not under it


def test_without_a_cgroup_v1_quota_the_affinity_mask_stays():
    unlimited = files({"/proc/self/cgroup": V1_CGROUP, "/proc/self/mountinfo": V1_MOUNTINFO,
                       V1_CPU + "docker/abc/cpu.cfs_quota_us": "-1\n",
                       V1_CPU + "docker/abc/cpu.cfs_period_us": "100000\n"})
    assert cpus.cpu_quota(unlimited) is None and cpus.usable_cpus(unlimited, mask=lambda: {0, 1, 2}) == 3
    no_mount = files({"/proc/self/cgroup": V1_CGROUP, V1_CPU + "docker/abc/cpu.cfs_quota_us": "100000\n",
                      V1_CPU + "docker/abc/cpu.cfs_period_us": "100000\n"})
    assert cpus.cpu_quota(no_mount) is None  # no mountinfo: where the hierarchy is is not known


def test_a_cgroup_v1_quota_means_the_host_is_not_the_jobs_neighbourhood():
    """A cgroup v1 container with every CPU in its mask but a quota: the host's load says
    nothing of it, so the rule is off (without the quota it reads the host's load, as before)."""
    quota = {"/proc/self/cgroup": V1_CGROUP, "/proc/self/mountinfo": V1_MOUNTINFO,
             V1_CPU + "docker/abc/cpu.cfs_quota_us": "400000\n", V1_CPU + "docker/abc/cpu.cfs_period_us": "100000\n",
             "/proc/loadavg": "9.0 9.0 9.0 9/300 1\n"}
    assert cpus.Neighbours(4, read=files(quota), mask=lambda: set(range(8)), machine_cpus=8).how == "off"
    unlimited = {**quota, V1_CPU + "docker/abc/cpu.cfs_quota_us": "-1\n"}
    assert cpus.Neighbours(4, read=files(unlimited), mask=lambda: set(range(8)), machine_cpus=8).how == "load"


CONTAINER = "/sys/fs/cgroup/unified/docker/c1/"


def container(stalled_us: list[int]) -> dict[str, str]:
    """A container's files (its namespaced root, a non-root cgroup: cgroup.type) whose CPU
    pressure reads ``full total=`` the last value of ``stalled_us``, on a host whose load
    counts 60 runnable tasks."""
    class Files(dict):
        def get(self, path, default=None):
            if path == CONTAINER + "cpu.pressure":
                return f"some avg10=0 avg60=0 avg300=0 total=1\nfull avg10=0 avg60=0 avg300=0 total={stalled_us[-1]}\n"
            return super().get(path, default)
    return Files({"/proc/self/cgroup": "0::/docker/c1\n", "/proc/self/mountinfo": HYBRID_MOUNTINFO,
                  CONTAINER + "cgroup.type": "domain\n", "/proc/loadavg": "60.0 60.0 60.0 60/900 1\n"})


def test_in_a_container_on_a_busy_host_only_this_cgroups_pressure_counts():
    """The host's 60 runnable tasks say nothing; the cgroup stalled whole (something outside
    it held its CPUs) for at least half of a long yield since the last look does."""
    stalled = [1000]
    neighbours = cpus.Neighbours(4, read=container(stalled).get, mask=lambda: set(range(8)), machine_cpus=8)
    assert neighbours.how == "pressure"
    assert not neighbours.busy(0.005)  # no stall since it was made
    stalled.append(1000 + 2400)  # 2.4 ms of a 5 ms yield: its ranks ran the rest
    assert not neighbours.busy(0.005)
    stalled.append(stalled[-1] + 4000)
    assert neighbours.busy(0.005)
    assert not neighbours.busy(0.005)  # counted from the last look
    without_psi = {**container(stalled), CONTAINER + "cpu.pressure": "some avg10=0 total=5\n"}  # before Linux 5.13
    assert cpus.Neighbours(4, read=without_psi.get, mask=lambda: set(range(8)), machine_cpus=8).how == "off"


def test_the_hosts_load_counts_only_where_the_job_is_the_whole_host():
    host = {"/proc/self/cgroup": "0::/\n", "/proc/self/mountinfo": HYBRID_MOUNTINFO,
            "/sys/fs/cgroup/unified/cpu.pressure": "some avg10=0 total=5\nfull avg10=0 total=0\n",
            "/proc/loadavg": "9.0 9.0 9.0 9/300 1\n"}
    whole = cpus.Neighbours(4, read=files(host), mask=lambda: set(range(8)), machine_cpus=8)
    assert whole.how == "load" and whole.busy(0.005)
    assert not cpus.Neighbours(12, read=files(host), mask=lambda: set(range(8)), machine_cpus=8).busy(0.005)
    pinned = cpus.Neighbours(4, read=files(host), mask=lambda: {0}, machine_cpus=8)  # taskset: others' CPUs too
    assert pinned.how == "off" and not pinned.busy(0.005)
    quota = files({**host, "/sys/fs/cgroup/unified/cpu.max": "100000 100000"})
    assert cpus.Neighbours(4, read=quota, mask=lambda: set(range(8)), machine_cpus=8).how == "off"
    assert cpus.Neighbours(4, read=files({"/proc/loadavg": "9 9 9 9/300 1"}), mask=lambda: set(range(8)),
                           machine_cpus=8).how == "load"  # no cgroup v2: the job as the host, as before


def test_this_process_reads_its_own_affinity():
    assert cpus.usable_cpus() <= len(os.sched_getaffinity(0))


NO_FILES = files({})


def _share(store, rank: int, mask: set[int], read=NO_FILES) -> CpuShare:
    return CpuShare(store, "machine-a", rank, read=read, mask=lambda: mask, machine_cpus=8)


def test_ranks_bound_each_to_a_core_of_their_own_run_side_by_side():
    """Open MPI's and srun's per-rank binding: each mask has one CPU, the union has two."""
    store = HashStore()
    shares = [_share(store, rank, {rank}) for rank in range(2)]
    assert [share.cpus([0, 1]) for share in shares] == [2, 2]


def test_ranks_pinned_together_share_their_cpus():
    """taskset -c 0 on the whole job: two ranks, one CPU."""
    store = HashStore()
    shares = [_share(store, rank, {0}) for rank in range(2)]
    assert [share.cpus([0, 1]) for share in shares] == [1, 1]
    three = [_share(store, rank, {0, 1}) for rank in range(2, 5)]
    assert three[0].cpus([2, 3, 4]) == 2


def test_a_rank_with_the_whole_machine_appends_nothing_and_counts_for_it():
    store = HashStore()
    whole, narrowed = _share(store, 0, set(range(8))), _share(store, 1, {3})
    assert store.get("shm/cpus/machine-a") == cpus.entry(1, {3}).encode()
    assert narrowed.cpus([0, 1]) == 8 and whole.cpus([0, 1]) == 8
    assert narrowed.cpus([1]) == 1  # alone: no store read needed


def test_the_quota_caps_the_union_and_a_malformed_entry_is_skipped():
    store = HashStore()
    quota = files({"/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/cpu.max": "100000 100000"})
    shares = [_share(store, rank, {rank}, quota) for rank in range(2)]
    assert shares[0].cpus([0, 1]) == 1
    store.append("shm/cpus/machine-a", "2:zz;3;:1;4:1")
    assert cpus.masks(store.get("shm/cpus/machine-a").decode()) == {0: 1, 1: 2, 4: 1}


@pytest.mark.parametrize("cpus_given, expected", [({0, 1, 2}, "7"), ({63}, "8000000000000000")])
def test_an_entry_is_the_rank_and_its_mask_in_hex(cpus_given, expected):
    assert cpus.entry(12, cpus_given) == f"12:{expected};"
    assert cpus.masks(cpus.entry(12, cpus_given)) == {12: int(expected, 16)}



RANK_SAYS = ("import pydist; from pydist.groups.world import current; pydist.init_process_group(); "
             "print(current().transport.oversubscribed, flush=True); pydist.destroy_process_group()")


def _oversubscribed(masks: list[set[int]]) -> list[str]:
    """Whether each rank of a job whose rank r runs on the CPUs ``masks[r]`` (set before it
    starts, as taskset or a launcher's binding does) finds itself oversubscribed."""
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", RANK_SAYS], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "RANK": str(rank), "WORLD_SIZE": str(len(masks)), "PYDIST_SHM": "1",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
                              preexec_fn=functools.partial(os.sched_setaffinity, 0, mask))
             for rank, mask in enumerate(masks)]
    try:
        return [proc.communicate(timeout=60)[0].strip() for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.mark.slow  # jobs of two processes: ~1-2 s each
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to tell pinned from free")
def test_ranks_pinned_to_one_cpu_are_oversubscribed_and_ranks_bound_apart_are_not():
    """taskset -c 0 on the job: the waits must not spin long, as with more ranks than the
    machine's CPUs (os.cpu_count() said 2); bound one per CPU (mpiexec, srun --cpu-bind), the
    ranks run side by side, as do free ones."""
    first, second, *_ = sorted(os.sched_getaffinity(0))
    assert _oversubscribed([{first}, {first}]) == ["True", "True"]
    assert _oversubscribed([{first}, {second}]) == ["False", "False"]
    assert _oversubscribed([{first, second}] * 2) == ["False", "False"]
