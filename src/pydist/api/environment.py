"""torch.distributed's questions about the job and the library, answered for pydist:
``is_torchelastic_launched``, ``get_node_local_rank``, ``get_pg_count``, ``supports_complex``,
``is_backend_available`` and the ``is_<backend>_available`` family, ``default_pg_timeout``.
Semantics and wording are torch 2.13's; the backends are pydist's ("pydist", and "mpi" when
mpi4py imports)."""
from __future__ import annotations

import importlib.util
import os

from ..core.deadline import DEFAULT_PG_TIMEOUT
from ..core.ops import RedOpType
from ..groups.world import current

default_pg_timeout = DEFAULT_PG_TIMEOUT

#: Reductions that complex tensors cannot take (torch's deny list).
_NOT_FOR_COMPLEX = (RedOpType.MAX, RedOpType.MIN, RedOpType.PRODUCT, RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR)


def is_torchelastic_launched() -> bool:
    """Whether a torchelastic-style launcher (torchrun, pydist-run) started this process
    (TORCHELASTIC_RUN_ID is set)."""
    return os.getenv("TORCHELASTIC_RUN_ID") is not None


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank on its node (LOCAL_RANK), else ``fallback_rank``, else an error."""
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["LOCAL_RANK"])
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError("LOCAL_RANK is not in the environment. Consider passing fallback_rank to allow "
                       "`get_node_local_rank` to work, assuming you are not running in a multi-device context "
                       "and want the code to run locally instead.")


def get_pg_count() -> int:
    """The number of process groups created since init_process_group (the default one too)."""
    return sum(current().group_counts.values())


def supports_complex(reduceOp) -> bool:  # noqa: N803 - torch's argument name
    """Whether complex tensors can be reduced with ``reduceOp`` (SUM, AVG, PREMUL_SUM)."""
    return getattr(reduceOp, "op", reduceOp) not in _NOT_FOR_COMPLEX


def is_mpi_available() -> bool:
    """pydist's MPI backend works here (mpi4py imports)."""
    return importlib.util.find_spec("mpi4py") is not None


def is_gloo_available() -> bool:
    """False: pydist is its own backend (torch's gloo is torch's; use torch for it)."""
    return False


def is_nccl_available() -> bool:
    """False: pydist runs on CPUs."""
    return False


def is_ucc_available() -> bool:
    """False: pydist has no UCC backend."""
    return False


def is_xccl_available() -> bool:
    """False: pydist has no XCCL backend."""
    return False


def is_backend_available(backend: str) -> bool:
    """Whether ``init_process_group(backend)`` can work here: "pydist" always, "mpi" with mpi4py."""
    name = str(backend).lower()
    return name == "pydist" or (name == "mpi" and is_mpi_available())
