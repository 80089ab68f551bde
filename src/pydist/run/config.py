"""What to launch: the launch configuration, each worker's command line and environment.

Pure functions of a :class:`LaunchConfig` (no processes, no sockets), so the exact
environment a worker sees is testable on its own. The variables and their values are
torchrun's (``LocalElasticAgent._start_workers``) for a static, single-role job:
global rank = ``node_rank * nproc_per_node + local_rank``.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

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
    messages). ``master_port`` 0 means "a free port chosen by the kernel" when this node hosts the
    store. ``shutdown_timeout`` is the grace period (seconds) between the termination
    signal and SIGKILL.
    """

    nproc_per_node: int
    command: list[str]
    entrypoint: str = ""
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    run_id: str = ""
    role: str = "default"
    max_restarts: int = 0
    shutdown_timeout: float = 5.0
    base_env: dict[str, str] = field(default_factory=lambda: dict(os.environ))

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    def global_rank(self, local_rank: int) -> int:
        return self.node_rank * self.nproc_per_node + local_rank

    def sets_omp_num_threads(self) -> bool:
        """True when workers get OMP_NUM_THREADS=1 from the launcher (see :data:`OMP_NOTE`)."""
        return self.nproc_per_node > 1 and "OMP_NUM_THREADS" not in self.base_env


def worker_command(
    script: str, script_args: list[str], module: bool = False, no_python: bool = False
) -> list[str]:
    """The argv of every worker, as torchrun builds it.

    ``[python, -u, script, *args]``, ``[python, -u, -m, module, *args]`` or, with
    ``no_python``, ``[script, *args]``. ``python`` is ``$PYTHON_EXEC`` or the launcher's
    own interpreter. Raises ValueError for ``module`` together with ``no_python``.
    """
    if no_python:
        if module:
            raise ValueError("Don't use both the '--no-python' flag and the '--module' flag at the same time.")
        return [script, *script_args]
    python = os.environ.get("PYTHON_EXEC", sys.executable)
    return [python, "-u", *(["-m"] if module else []), script, *script_args]


def worker_env(config: LaunchConfig, local_rank: int, master_port: int, restart_count: int = 0) -> dict[str, str]:
    """The full environment of worker ``local_rank``: the launcher's plus torchrun's variables."""
    rank = config.global_rank(local_rank)
    env = dict(config.base_env)
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(config.world_size),
            "LOCAL_WORLD_SIZE": str(config.nproc_per_node),
            "GROUP_RANK": str(config.node_rank),
            "GROUP_WORLD_SIZE": str(config.nnodes),
            "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(config.world_size),
            "ROLE_NAME": config.role,
            "MASTER_ADDR": config.master_addr,
            "MASTER_PORT": str(master_port),
            "TORCHELASTIC_RUN_ID": config.run_id,
            "TORCHELASTIC_RESTART_COUNT": str(restart_count),
            "TORCHELASTIC_MAX_RESTARTS": str(config.max_restarts),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
        }
    )
    if config.sets_omp_num_threads():
        env["OMP_NUM_THREADS"] = "1"
    return env
