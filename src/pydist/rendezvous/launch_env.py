"""Who this process is in its job, read from what its launcher exported.

Each value comes from the first source that has it:

- rank / world_size: the explicit argument, then RANK / WORLD_SIZE, then the launcher's;
- local_rank / local_world_size: LOCAL_RANK / LOCAL_WORLD_SIZE, then the launcher's (None
  if unknown);
- master_addr: MASTER_ADDR; else for Slurm the first host of the step's node list; for
  mpiexec and submitit's local executor 127.0.0.1 when every rank is on this host (local
  size == size);
- master_port: MASTER_PORT; else :func:`job_port` of a job id every rank of the job shares.

The launcher is the first of :data:`LAUNCHERS` whose rank variable is set. MPI launchers
come before Slurm because mpiexec inside an sbatch script inherits the batch step's
SLURM_PROCID=0, and submitit's LocalExecutor (SUBMITIT_LOCAL_GLOBALID, LOCALID, NTASKS,
JOB_ID: one host) comes before Slurm for the same reason. What cannot be found raises one
:class:`MissingLaunchVariables` (a SettingError, so a ValueError) naming every missing variable once.
"""
from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import product

from ..core.errors import SettingError

#: derived ports: 20000-32767, under the ephemeral ports Linux hands out from 32768
#: (net.ipv4.ip_local_port_range), which any connection on rank 0's host may hold
PORT_BASE, PORT_SPAN = 20000, 12768
_SLURM_NODELISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
_SLURM_STEP_IDS = ("SLURM_STEP_ID", "SLURM_STEPID")


@dataclass(frozen=True)
class LaunchInfo:
    """This process's place in its job and the address of the job's store.

    ``launcher``: "torchrun" (torchrun or pydist-run), "openmpi", "mpich", "submitit",
    "slurm", "pmix", or "env" (RANK/WORLD_SIZE/MASTER_* set by hand)."""

    launcher: str
    rank: int
    world_size: int
    local_rank: int | None
    local_world_size: int | None
    master_addr: str
    master_port: int


@dataclass(frozen=True)
class Launcher:
    """The variables one launcher exports (the first set one of each tuple counts)."""

    name: str
    title: str
    rank: str
    size: tuple[str, ...]
    local_rank: tuple[str, ...]
    local_size: tuple[str, ...]
    job_id: tuple[str, ...]


LAUNCHERS = (
    Launcher("openmpi", "mpiexec (Open MPI)", "OMPI_COMM_WORLD_RANK", ("OMPI_COMM_WORLD_SIZE",),
             ("OMPI_COMM_WORLD_LOCAL_RANK",), ("OMPI_COMM_WORLD_LOCAL_SIZE",),
             ("OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE", "OMPI_MCA_orte_hnp_uri")),
    Launcher("mpich", "mpiexec (MPICH Hydra)", "PMI_RANK", ("PMI_SIZE",), ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
             ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"), ("PMI_PORT", "PMI_KVSNAME", "PMI_JOBID", "PALS_APID")),
    Launcher("submitit", "submitit's LocalExecutor", "SUBMITIT_LOCAL_GLOBALID", ("SUBMITIT_LOCAL_NTASKS",),
             ("SUBMITIT_LOCAL_LOCALID",), ("SUBMITIT_LOCAL_NTASKS",), ("SUBMITIT_LOCAL_JOB_ID",)),
    Launcher("slurm", "srun (Slurm)", "SLURM_PROCID", ("SLURM_NTASKS", "SLURM_NPROCS"), ("SLURM_LOCALID",),
             ("SLURM_NTASKS_PER_NODE",), ("SLURM_JOB_ID", "SLURM_JOBID")),
    Launcher("pmix", "a PMIx launcher", "PMIX_RANK", (), (), (), ("PMIX_NAMESPACE",)),
)


class MissingLaunchVariables(SettingError):
    """Variables neither set nor derivable from the launcher's; ``missing`` has one entry per
    variable (its name, and why the launcher's variables do not give it, where one was found)."""

    def __init__(self, missing: list[str], launcher: Launcher | None):
        self.missing = missing
        note = "" if launcher is not None else \
            f"; no launcher found: none of {', '.join(known.rank for known in LAUNCHERS)} is set"
        super().__init__("Error initializing pydist using env:// rendezvous: environment variables expected, "
                         "but not set: " + "; ".join(missing) + note)


def job_port(job_key: str) -> int:
    """The port every rank derives from the job id text they share: 20000 + (the first 8
    bytes of SHA-256(job_key), big-endian) mod 12768, so two jobs rarely collide and no
    ephemeral port (32768 and up) is taken."""
    digest = hashlib.sha256(job_key.encode()).digest()
    return PORT_BASE + int.from_bytes(digest[:8], "big") % PORT_SPAN


def parse_hostlist(text: str) -> list[str]:
    """A Slurm hostlist as host names in order: ``node[01-02,07],gpu-a[1-2],login1`` is
    node01 node02 node07 gpu-a1 gpu-a2 login1. A range keeps its lower bound's zero padding
    (``n[009-011]``); several bracket groups in one name multiply (``r[1-2]n[1-2]``).
    ValueError for unbalanced or nested brackets, empty names and backwards ranges."""
    hosts: list[str] = []
    for item in _split_top_level(text):
        parts = re.split(r"\[([^\[\]]*)\]", item)
        literals = "".join(parts[0::2])
        if not item or "[" in literals or "]" in literals:
            raise ValueError(f"hostlist {text!r}: bad host name {item!r}")
        choices = [[part] if i % 2 == 0 else _expand_ranges(part, text) for i, part in enumerate(parts)]
        hosts.extend("".join(chosen) for chosen in product(*choices))
    return hosts


def _split_top_level(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(f"hostlist {text!r}: unbalanced or nested brackets")
        if char == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    if depth:
        raise ValueError(f"hostlist {text!r}: unbalanced brackets")
    return items + [text[start:].strip()]


def _expand_ranges(spec: str, text: str) -> list[str]:
    """``01-03,7`` as ["01", "02", "03", "7"]."""
    out: list[str] = []
    for piece in spec.split(","):
        low, dash, high = piece.strip().partition("-")
        high = high if dash else low
        if not (low.isdigit() and high.isdigit()) or int(high) < int(low):
            raise ValueError(f"hostlist {text!r}: bad range {piece!r} in [{spec}]")
        out.extend(f"{n:0{len(low)}d}" for n in range(int(low), int(high) + 1))
    return out


def parse_tasks_per_node(text: str) -> list[int]:
    """Slurm's SLURM_TASKS_PER_NODE as one count per node: ``2(x3),1`` is [2, 2, 2, 1]."""
    counts = []
    for item in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", item)
        if not match:
            raise ValueError(f"tasks per node {text!r}: expected items like 4 or 2(x3)")
        counts.extend([int(match[1])] * int(match[2] or 1))
    return counts


def detect_launcher(env: Mapping[str, str]) -> Launcher | None:
    """The first launcher of :data:`LAUNCHERS` whose rank variable is set, or None."""
    return next((launcher for launcher in LAUNCHERS if env.get(launcher.rank)), None)


def _first(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, str] | None:
    return next(((name, env[name]) for name in names if env.get(name)), None)


def _int(env: Mapping[str, str], *names: str) -> int | None:
    found = _first(env, names)
    if found is None:
        return None
    try:
        return int(found[1])
    except ValueError:
        raise SettingError(f"environment variable {found[0]}={found[1]!r} is not an integer") from None


def _slurm_local_size(env: Mapping[str, str]) -> int | None:
    """This node's task count: SLURM_(STEP_)TASKS_PER_NODE at SLURM_NODEID, else
    SLURM_NTASKS_PER_NODE."""
    found, node = _first(env, ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")), _int(env, "SLURM_NODEID")
    if found is not None and node is not None:
        counts = parse_tasks_per_node(found[1])
        if 0 <= node < len(counts):
            return counts[node]
    return _int(env, "SLURM_NTASKS_PER_NODE")


def _launcher_pid(rank_variable: str) -> int:
    """The nearest ancestor whose environment lacks ``rank_variable``: the launcher's process
    (Hydra's proxy, Open MPI's daemon) that started every rank on this host. Linux only;
    elsewhere, or if /proc cannot be read, the parent."""
    marker, pid = rank_variable.encode() + b"=", os.getppid()
    for _ in range(32):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
            with open(f"/proc/{pid}/stat", "rb") as f:
                parent = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return pid
        if parent <= 1 or not any(entry.startswith(marker) for entry in environ):
            return pid
        pid = parent
    return pid


class _Resolver:
    """Resolves one value after another, collecting what is missing."""

    def __init__(self, env: Mapping[str, str], launcher: Launcher | None):
        self.env, self.launcher = env, launcher
        self.missing: list[str] = []

    def number(self, value: int | None, generic: str, own: tuple[str, ...], optional: bool = False) -> int | None:
        """``value``, else the generic variable, else the launcher's own ones."""
        if value is None:
            value = _int(self.env, generic)
        if value is None and self.launcher is not None:
            value = _int(self.env, *own)
        if value is None and not optional:
            self.missing.append(self._why_missing(generic, own))
        return value

    def _why_missing(self, generic: str, own: tuple[str, ...]) -> str:
        if self.launcher is None:
            return generic  # the message says once that no launcher was found
        if not own:
            return f"{generic} ({self.launcher.title} exports no {generic.lower()})"
        return f"{generic} ({self.launcher.title} set {self.launcher.rank} but not {' or '.join(own)})"

    def address(self, single_host: bool) -> str | None:
        """MASTER_ADDR, else the launcher's default (see the module doc)."""
        if self.env.get("MASTER_ADDR"):
            return self.env["MASTER_ADDR"]
        launcher = self.launcher
        if launcher is None:
            self.missing.append("MASTER_ADDR")
        elif launcher.name == "slurm":
            found = _first(self.env, _SLURM_NODELISTS)
            if found is not None:
                try:
                    return parse_hostlist(found[1])[0]
                except ValueError as error:
                    raise SettingError(f"environment variable {found[0]}: {error}") from None
            self.missing.append(f"MASTER_ADDR ({launcher.title} set none of {', '.join(_SLURM_NODELISTS)})")
        elif single_host:
            return "127.0.0.1"
        else:
            self.missing.append(f"MASTER_ADDR ({launcher.title} does not show every rank on this host "
                                f"(local size = size); set it to the host of rank 0)")
        return None

    def port(self, single_host: bool) -> int | None:
        """MASTER_PORT, else :func:`job_port` of the launcher's job id."""
        text = self.env.get("MASTER_PORT")
        if text:
            if not text.isdigit() or not 0 < int(text) < 65536:
                raise SettingError(f"environment variable MASTER_PORT={text!r} is not a port number")
            return int(text)
        key = self._job_key(single_host)
        if key is not None:
            return job_port(key)
        if self.launcher is None:
            self.missing.append("MASTER_PORT")
        else:
            self.missing.append(f"MASTER_PORT ({self.launcher.title} set no job id shared by every rank: "
                                f"none of {', '.join(self.launcher.job_id)})")
        return None

    def _job_key(self, single_host: bool) -> str | None:
        """``VAR=value`` of the launcher's job id (and Slurm's step); for an MPI launcher
        without one whose ranks all share this host, the pid of its local process."""
        launcher = self.launcher
        if launcher is None:
            return None
        found = _first(self.env, launcher.job_id)
        if found is not None:
            step = _first(self.env, _SLURM_STEP_IDS) if launcher.name == "slurm" else None
            return ";".join(f"{name}={value}" for name, value in filter(None, (found, step)))
        if launcher.name != "slurm" and single_host:
            return f"{launcher.name}-pid={_launcher_pid(launcher.rank)}"
        return None


def launch_info(rank: int | None = None, world_size: int | None = None,
                environ: Mapping[str, str] | None = None) -> LaunchInfo:
    """This process's :class:`LaunchInfo` from ``environ`` (default: os.environ); rank and
    world_size override the environment. MissingLaunchVariables naming every missing
    variable, or ValueError naming a variable that is not a number."""
    env = os.environ if environ is None else environ
    launcher = detect_launcher(env)
    find = _Resolver(env, launcher)
    own = launcher or Launcher("", "", "", (), (), (), ())
    rank = find.number(rank, "RANK", (own.rank,))
    world_size = find.number(world_size, "WORLD_SIZE", own.size)
    local_rank = find.number(None, "LOCAL_RANK", own.local_rank, optional=True)
    local_size = find.number(None, "LOCAL_WORLD_SIZE", own.local_size, optional=True)
    if local_size is None and own.name == "slurm":
        local_size = _slurm_local_size(env)
    single_host = world_size is not None and local_size == world_size
    addr, port = find.address(single_host), find.port(single_host)
    if find.missing:
        raise MissingLaunchVariables(find.missing, launcher)
    # each of these is found or named in find.missing
    assert rank is not None and world_size is not None and addr is not None and port is not None
    if env.get("RANK") and env.get("TORCHELASTIC_RUN_ID"):
        name = "torchrun"
    else:
        name = own.name or "env"
    return LaunchInfo(name, rank, world_size, local_rank, local_size, addr, port)
