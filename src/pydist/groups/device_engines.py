"""Each group's device engine on this rank: made at its first call with device tensors.

``engine_of(group)`` gives the group's pydist.engines.device.DeviceEngine (over its native
engine; a group on the MPI engine has none: ValueError); ``close(group)`` releases it (the
group's destroy). ``bound(group)`` says whether the group has run device tensors yet.

``opt_in(group, tensor, name)``: CUDA tensors run on pydist's device engine only when asked
for (PYDIST_CUDA_ENGINE=1, or a torch group made with "cpu:pydist,cuda:pydist": ``allow``),
as it has not yet passed its checks on a GPU; the stand-in's arrays always do (tests).
"""
from __future__ import annotations

import weakref
from typing import Any

from ..core.buffers import device_kind
from ..core.settings import settings
from ..engines.device import DeviceEngine
from ..engines.device_across import AcrossHostsEngine

_ENGINES: weakref.WeakKeyDictionary[Any, DeviceEngine] = weakref.WeakKeyDictionary()
_ALLOWED: weakref.WeakSet[Any] = weakref.WeakSet()


def allow(group: Any) -> None:
    """Run ``group``'s CUDA tensors on the device engine (its backend string said "cuda:pydist")."""
    _ALLOWED.add(group)


def allowed(group: Any) -> bool:
    """Whether ``group``'s CUDA tensors run on the device engine (PYDIST_CUDA_ENGINE=1, or
    ``allow``)."""
    return settings().cuda_engine or group in _ALLOWED


def opt_in(group: Any, tensor: Any, name: str) -> None:
    """Return when ``tensor`` (a device tensor) may run on ``group``'s device engine; else the
    ValueError saying how to ask for it."""
    if device_kind(tensor) in (None, "standin") or allowed(group):
        return
    raise ValueError(f"{name}: a tensor on {tensor.device}; pydist's own CUDA engine is opt-in until it has "
                     "passed its GPU checks: set PYDIST_CUDA_ENGINE=1 (or, with torch, "
                     "init_process_group(\"cpu:pydist,cuda:pydist\")), or run CUDA tensors on gloo or NCCL "
                     "beside pydist (init_process_group(\"cpu:pydist,cuda:gloo\")), or move it with .cpu()")


def engine_of(group: Any) -> DeviceEngine:
    """``group``'s device engine (made now if it has none)."""
    found = _ENGINES.get(group)
    if found is None:
        native = group.engine
        if not hasattr(native, "arena"):
            raise ValueError(f"device tensors run on pydist's native engine; this group runs on {native.name} "
                             "(move them with .cpu(), or make the group with the native engine)")
        found = _ENGINES[group] = (AcrossHostsEngine if native.spans_hosts else DeviceEngine)(native)
    return found


def bound(group: Any) -> bool:
    """Whether ``group`` has run a call with device tensors."""
    found = _ENGINES.get(group)
    return found is not None and found.device is not None


def close(group: Any) -> None:
    """Release ``group``'s device engine, if it has one."""
    found = _ENGINES.pop(group, None)
    if found is not None:
        found.close()
