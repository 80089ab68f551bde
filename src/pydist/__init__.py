"""pydist: torch.distributed's communication system in Python on numpy.

``import pydist as dist`` runs CPU code written for ``torch.distributed``: process groups,
stores, point-to-point and collective operations on numpy arrays, torch CPU tensors and
buffer-protocol objects.
"""
from __future__ import annotations

from .api.breakpoint import breakpoint
from .api.coalesced import (
    all_gather_coalesced,
    all_gather_single,
    all_reduce_coalesced,
    gather_into_tensor,
    reduce_scatter_single,
)
from .api.collectives import (
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    gather_single,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
)
from .api.debug_level import DebugLevel, get_debug_level, set_debug_level, set_debug_level_from_env
from .api.elastic import Elastic
from .api.environment import (
    default_pg_timeout,
    get_node_local_rank,
    get_pg_count,
    is_backend_available,
    is_gloo_available,
    is_mpi_available,
    is_nccl_available,
    is_torchelastic_launched,
    is_ucc_available,
    is_xccl_available,
    supports_complex,
)
from .api.groups import (
    Backend,
    GroupMember,
    get_backend,
    get_backend_config,
    get_backend_impl,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    is_available,
    is_initialized,
    new_group,
    new_subgroups,
    new_subgroups_by_enumeration,
    set_timeout,
)
from .api.grow import admit_joiners
from .api.init import destroy_process_group, init_process_group
from .api.monitored import monitored_barrier
from .api.objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from .api.p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
from .api.shrink import SHRINK_ABORT, SHRINK_DEFAULT, shrink_group, split_group
from .core.errors import (
    DesyncError,
    DistBackendError,
    DistError,
    DistNetworkError,
    DistStoreError,
    EvictedError,
    GroupAbortedError,
    OpTimeoutError,
    PeerFailedError,
    QueueEmptyError,
)

# torch.distributed exposes _make_nccl_premul_sum at top level; the redundant alias marks it a re-export
# without putting a private name in __all__.
from .core.ops import ReduceOp, reduce_op
from .core.ops import _make_nccl_premul_sum as _make_nccl_premul_sum
from .groups.process_group import ProcessGroup
from .groups.work import Work
from .net.auth import AuthenticationError
from .rendezvous import register_rendezvous_handler
from .store import FileStore, HashStore, PrefixStore, Store, TCPStore

__version__ = "0.1.0"


def __getattr__(name: str):
    """``pydist.DistributedDataParallel`` needs torch, so it is imported on first use only."""
    if name == "DistributedDataParallel":
        from .torch.ddp import DistributedDataParallel
        return DistributedDataParallel
    raise AttributeError(f"module 'pydist' has no attribute {name!r}")


__all__ = [
    "Backend", "DistBackendError", "DistributedDataParallel", "DistError", "DistNetworkError", "DistStoreError",
    "FileStore", "GroupMember", "AuthenticationError", "DesyncError", "GroupAbortedError", "OpTimeoutError",
    "HashStore", "P2POp", "PeerFailedError", "PrefixStore", "ProcessGroup", "QueueEmptyError", "ReduceOp", "Store",
    "SHRINK_ABORT", "SHRINK_DEFAULT",
    "TCPStore", "Work", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_to_all",
    "all_to_all_single", "barrier", "monitored_barrier", "batch_isend_irecv", "broadcast", "broadcast_object_list",
    "destroy_process_group", "gather", "gather_object", "get_backend", "get_global_rank", "get_group_rank",
    "get_process_group_ranks", "get_rank", "get_world_size", "group", "init_process_group", "irecv",
    "is_available", "is_initialized", "isend", "new_group", "new_subgroups", "new_subgroups_by_enumeration",
    "recv", "recv_object_list", "reduce", "reduce_op", "reduce_scatter", "reduce_scatter_tensor", "scatter",
    "scatter_object_list", "send", "send_object_list", "shrink_group", "split_group",
    "default_pg_timeout", "get_node_local_rank", "get_pg_count", "is_backend_available", "is_gloo_available",
    "is_mpi_available", "is_nccl_available", "is_torchelastic_launched", "is_ucc_available", "is_xccl_available",
    "supports_complex", "all_gather_single", "all_reduce_coalesced", "reduce_scatter_single",
    "get_backend_config", "register_rendezvous_handler",
    "all_gather_coalesced", "breakpoint", "DebugLevel", "get_debug_level", "set_debug_level",
    "set_debug_level_from_env", "admit_joiners", "Elastic", "EvictedError",
    "gather_single", "gather_into_tensor", "get_backend_impl", "set_timeout",
]
