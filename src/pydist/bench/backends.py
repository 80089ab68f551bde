"""The backends pydist-bench can measure, and whether each one can run here.

Names are those of ``--backend`` (``pydist``, ``gloo``, ``mpi``) and ``--compare``
(``gloo``, ``mpi``, ``pydist``, ``pydist-tls``, ``pydist-1nic``: one interface however many
are named, the baseline of striping; ``nccl``: torch's NCCL, with ``--device cuda`` only;
which runs the buffers of ``--device``: :mod:`.devices`). ``--backend mpi`` means pydist's
own MPI backend (``init_process_group("mpi")`` under mpiexec, key ``pydist-mpi``);
``--compare mpi`` means plain mpi4py on MPICH (key ``mpi``). Launchers: ``spawn`` starts N
processes that rendezvous through env:// (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, like
torchrun); ``mpiexec`` runs the venv's ``mpiexec -n N``; inside an already launched job
(:mod:`.injob`) no launcher runs, and the ``mpiexec`` backends need that job to have been
started by mpiexec. Adding a backend is one
entry in :data:`BACKENDS`.
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import comms


def mpiexec_path() -> str | None:
    """The mpiexec next to this Python (the venv's, from ``pip install mpich``), else on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else shutil.which("mpiexec")


@dataclass(frozen=True)
class BackendSpec:
    """How to run one backend: its column label, launcher, requirements and connect function."""

    key: str
    label: str
    launcher: str  # "spawn" or "mpiexec"
    connect: Callable[[float], Any]
    modules: tuple[str, ...] = ()
    install_hint: str = ""
    #: --transport tcp: the environment that keeps every byte on TCP sockets, as between hosts
    tcp_env: tuple[tuple[str, str], ...] = ()
    #: more environment for the workers, made in a scratch directory removed after the run
    extra_env: Callable[[str], dict[str, str]] | None = None

    def unavailable(self) -> str | None:
        """Why this backend cannot run here, or None if it can."""
        for module in self.modules:
            if importlib.util.find_spec(module) is None:
                return f"not installed ({module} cannot be imported; {self.install_hint})"
        if self.launcher == "mpiexec" and mpiexec_path() is None:
            return f"no mpiexec found next to {sys.executable} or on PATH ({self.install_hint})"
        return None


#: MPICH with no same-host shortcut and UCX on its tcp transport (pip's mpich is ch4:ucx).
MPICH_TCP = (("MPIR_CVAR_NOLOCAL", "1"), ("UCX_TLS", "tcp,self"))

def _tls_env(directory: str) -> dict[str, str]:
    """PYDIST_TLS_* of a certificate from a CA made for this run, which every rank presents."""
    from pydist.testing.tls import Authority
    return Authority(directory, "pydist-bench CA").issue("rank").env()


BACKENDS: dict[str, BackendSpec] = {spec.key: spec for spec in (
    BackendSpec("pydist", "pydist", "spawn", comms.connect_pydist, tcp_env=(("PYDIST_SHM", "0"),)),
    BackendSpec("pydist-1nic", "pydist 1 nic", "spawn", comms.connect_pydist_one_lane,
                tcp_env=(("PYDIST_SHM", "0"),)),
    BackendSpec("pydist-tls", "pydist+tls", "spawn", comms.connect_pydist_tls, ("cryptography",),
                "pip install cryptography (to make the run's certificates)", (("PYDIST_SHM", "0"),), _tls_env),
    BackendSpec("pydist-mpi", "pydist-mpi", "mpiexec", comms.connect_pydist_mpi, ("mpi4py",),
                "pip install mpi4py mpich", MPICH_TCP),
    BackendSpec("gloo", "gloo", "spawn", comms.connect_gloo, ("torch",), "pip install torch"),  # always tcp
    BackendSpec("mpi", "mpi", "mpiexec", comms.connect_mpi, ("mpi4py",), "pip install mpi4py mpich", MPICH_TCP),
    BackendSpec("nccl", "nccl", "spawn", comms.connect_nccl, ("torch",), "pip install torch (with CUDA)"),
)}

MAIN_CHOICES = {"pydist": "pydist", "gloo": "gloo", "mpi": "pydist-mpi"}
"""``--backend`` names -> BACKENDS keys."""

COMPARE_CHOICES = {"gloo": "gloo", "mpi": "mpi", "pydist": "pydist", "pydist-tls": "pydist-tls",
                   "pydist-1nic": "pydist-1nic", "nccl": "nccl"}
"""``--compare`` names -> BACKENDS keys."""
