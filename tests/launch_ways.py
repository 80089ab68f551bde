"""Starting a 2-rank job on this host each way a user can (the security tests' jobs).

``start(launch, argv)``: ``launch`` is "pydist-run", "torchrun", "torchrun-token", "env"
(two ranks by hand with env://), "env-token" or "mpiexec"; the "-token" ones set
PYDIST_AUTH_TOKEN (:data:`TOKEN`) for every rank, the others start with none (pydist-run
makes its own). ``argv``: the rank's script and its arguments. Returns the processes.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pydist.bench.backends import mpiexec_path
from pydist.testing import commands, free_port

TOKEN = "the job's secret"
LAUNCHES = ("pydist-run", "torchrun", "torchrun-token", "env", "env-token", "mpiexec")
_NOT_INHERITED = ("PYDIST_AUTH_TOKEN", "PYDIST_TLS_", "PYDIST_SHM", "OMPI_", "PMI_", "SLURM_", "TORCHELASTIC",
                  "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def env(**extra: str) -> dict[str, str]:
    """This process's environment without a job's variables, this interpreter's path, ``extra``."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_INHERITED)}
    return {**kept, "PYTHONPATH": os.pathsep.join(sys.path), **extra}


def start(launch: str, argv: list[str], **extra: str) -> list:
    """The job's launcher (or, by hand, its two ranks), each in a session of its own."""
    token = {"PYDIST_AUTH_TOKEN": TOKEN} if launch.endswith("-token") else {}
    if launch.startswith("torchrun"):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                   "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *argv]
    elif launch == "pydist-run":
        command = [sys.executable, "-m", "pydist.run", "--nproc-per-node", "2", *argv]
    elif launch == "mpiexec":
        command = [mpiexec_path() or "mpiexec", "-n", "2", sys.executable, *argv]
    else:
        port = str(free_port())
        return [commands.start_command([sys.executable, *argv], env=env(
            RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **token, **extra))
            for rank in range(2)]
    return [commands.start_command(command, env=env(**token, **extra))]


def skip_unless_available(launch: str) -> None:
    import pytest
    if launch == "mpiexec" and mpiexec_path() is None:
        pytest.skip("no mpiexec")
    if launch.startswith("torchrun"):
        pytest.importorskip("torch")


def wait_for(path: Path, procs: list, seconds: float) -> str:
    """The text of ``path`` once the job wrote it (AssertionError with the job's output if a
    process failed or ``seconds`` passed)."""
    ends = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > ends or any(proc.poll() not in (None, 0) for proc in procs):
            done = commands.finish(procs, 10)
            raise AssertionError(f"no {path.name} from the job:\n" + "\n".join(d.stderr[-3000:] for d in done))
        time.sleep(0.02)  # a file another process writes: nothing to wait on but the file system
    return path.read_text()
