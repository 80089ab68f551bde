"""What to launch: the launch configuration, each worker's command line and environment.

Pure functions of a :class:`LaunchConfig` (no processes, no sockets), so the exact
environment a worker sees is testable on its own. The variables and their values are
torchrun's (``LocalElasticAgent._start_workers``) for a single-role job: global rank =
``node_rank * nproc_per_node + local_rank``. TORCHELASTIC_RESTART_COUNT counts the
rounds before this one (restarts after failures and membership changes), job-wide.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from .logs import LogSpec

#: Put first on the workers' PYTHONPATH: its sitecustomize records uncaught exceptions.
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")

#: Workers get OMP_NUM_THREADS=1 when nproc_per_node > 1 and the user did not set it;
#: torchrun prints this note (once, to stderr) when it does so.
OMP_NOTE = (
    "\n*****************************************\n"
    "Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, "
    "to avoid your system being overloaded, please further tune the variable for optimal "
    "performance in your application as needed. \n"
    "*****************************************"
)


@dataclass
class LaunchConfig:
    """One node's share of a job: ``nproc_per_node`` workers running ``command``.

    ``command`` is every worker's argv, ``entrypoint`` the script or module it names (for
    messages). The agents meet through the store at ``master_addr:master_port`` (the
    rendezvous endpoint); ``master_port`` 0 means "a free port" when this node hosts the
    store. ``node_rank`` is -1 when the rendezvous assigns it (c10d), else ``--node-rank``
    (static). ``shutdown_timeout`` is the grace period (seconds) between the termination
    signal and SIGKILL; ``monitor_interval`` how often (seconds) the agent looks at the
    other agents' news in the store.
    """

    nproc_per_node: int
    command: list[str]
    entrypoint: str = ""
    min_nodes: int = 1
    max_nodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    run_id: str = ""
    role: str = "default"
    max_restarts: int = 0
    on_failure: str = "restart"  # or "continue": a failed worker is reported, the others go on;
    # or "replace": a replacement joins the running job (up to max_replacements in the job)
    max_replacements: int = 10
    shutdown_timeout: float = 5.0
    monitor_interval: float = 0.1
    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    connect_timeout: float = 60.0
    local_addr: str = ""
    logs: LogSpec = field(default_factory=LogSpec)
    base_env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    @property
    def static(self) -> bool:
        return self.node_rank >= 0

    def sets_omp_num_threads(self) -> bool:
        """True when workers get OMP_NUM_THREADS=1 from the launcher (see :data:`OMP_NOTE`)."""
        return self.nproc_per_node > 1 and "OMP_NUM_THREADS" not in self.base_env


@dataclass(frozen=True)
class Placement:
    """Where this node's workers sit in one round of the job."""

    node_rank: int = 0
    nnodes: int = 1
    restart_count: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0


def worker_command(script: str, script_args: list[str], module: bool = False, no_python: bool = False,
                   run_path: bool = False) -> list[str]:
    """The argv of every worker, as torchrun builds it.

    ``[python, -u, script, *args]``, ``[python, -u, -m, module, *args]``, with
    ``no_python`` ``[script, *args]``, with ``run_path`` (which wins over ``no_python``)
    ``[python, -u, -m, pydist.run.run_path, /abs/script, *args]`` (runpy.run_path).
    ``python`` is ``$PYTHON_EXEC`` or the launcher's own interpreter. Raises ValueError
    for ``module`` together with ``no_python``.
    """
    python = os.environ.get("PYTHON_EXEC", sys.executable)
    if run_path:
        return [python, "-u", "-m", "pydist.run.run_path", os.path.abspath(script), *script_args]
    if no_python:
        if module:
            raise ValueError("Don't use both the '--no-python' flag and the '--module' flag at the same time.")
        return [script, *script_args]
    return [python, "-u", *(["-m"] if module else []), script, *script_args]


def worker_env(config: LaunchConfig, placement: Placement, local_rank: int,
               error_file: str | None = None, auth_token: str | None = None) -> dict[str, str]:
    """The full environment of worker ``local_rank``: the launcher's plus torchrun's variables
    (and TORCHELASTIC_ERROR_FILE where its uncaught exception is recorded, if given),
    PYDIST_RUN_WORKER=1, and the job's secret as PYDIST_AUTH_TOKEN if it has one (see
    :mod:`.secret`)."""
    nproc = config.nproc_per_node
    rank, world_size = placement.node_rank * nproc + local_rank, placement.nnodes * nproc
    env = dict(config.base_env)
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": str(placement.node_rank),
            "GROUP_WORLD_SIZE": str(placement.nnodes),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world_size),
            "ROLE_NAME": config.role,
            "MASTER_ADDR": placement.master_addr,
            "MASTER_PORT": str(placement.master_port),
            "TORCHELASTIC_RUN_ID": config.run_id,
            "TORCHELASTIC_RESTART_COUNT": str(placement.restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(config.max_restarts),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "PYDIST_RUN_WORKER": "1",
        }
    )
    if auth_token:
        env["PYDIST_AUTH_TOKEN"] = auth_token
    if error_file is not None:
        env["TORCHELASTIC_ERROR_FILE"] = error_file
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [SITE_DIR, env.get("PYTHONPATH")]))
    if config.sets_omp_num_threads():
        env["OMP_NUM_THREADS"] = "1"
    return env
