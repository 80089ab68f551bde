"""Which backend runs a torch group's tensors on each device: pydist for CPU tensors, a torch
backend pydist's group owns for the others.

``init_process_group("cpu:pydist,cuda:gloo")`` (or ``cuda:nccl``) means pydist for CPU tensors
and gloo (NCCL) for CUDA ones. torch cannot do that by itself for a Python backend: pydist's
group is a Python ``ProcessGroup``, and torch replaces the whole group by it, dropping the other
devices' backends (``_new_process_group_helper``). So pydist's group makes them itself, on the
group's store (prefix "cuda/pydist/": torch may have made and dropped one under "cuda/"),
registers them on itself (so
``group._get_backend(torch.device("cuda"))`` answers as torch's would) and forwards every
operation whose tensors are on that device to them. The same holds when the backend string
does not name the device: ``pg_options=pydist.torch.Options(cuda="gloo")`` or PYDIST_CUDA.

torch hands a backend's creator only its own device's store and options, not the backend
string; ``backend_config`` is read from the creator's caller (torch's group factory) instead
(torch 2.11 to 2.13). A tensor on a device no backend of the group runs is refused at the call
(``ProcessGroupPydist.route``), never dropped.
"""
from __future__ import annotations

import inspect
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as tdist
from torch._C._distributed_c10d import _create_work_from_future  # type: ignore[attr-defined]

BUILDERS = ("gloo", "nccl")  # the backends pydist's group can make for a device


def backend_string_map() -> dict[str, str] | None:
    """The device -> backend map of the group torch is making now (called from a backend
    creator): ``{"cpu": "pydist", "cuda": "gloo"}``; None where torch does not show it."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            config = frame.f_locals.get("backend_config") if frame.f_code.co_name == "_new_process_group_helper" \
                else None
            if config is not None and hasattr(config, "get_device_backend_map"):
                return {device: str(name).lower() for device, name in config.get_device_backend_map().items()}
            frame = frame.f_back
        return None
    finally:
        del frame


def other_devices(string_map: dict[str, str] | None, cuda: str | None) -> dict[str, str]:
    """The devices whose tensors another backend runs: device -> backend name. The backend
    string decides where it names a device; else ``cuda`` (pg_options or PYDIST_CUDA) for CUDA
    ("pydist" or None: CUDA tensors stay pydist's)."""
    chosen = {device: name for device, name in (string_map or {}).items() if device != "cpu" and name != "pydist"}
    if "cuda" not in (string_map or {}) and cuda not in (None, "pydist"):
        chosen["cuda"] = str(cuda)
    for device, name in chosen.items():
        if name not in BUILDERS:
            raise ValueError(f"init_process_group: pydist runs beside {' or '.join(BUILDERS)} for {device} tensors; "
                             f"got {device}:{name} (write \"cpu:pydist,{device}:gloo\" or "
                             f"\"cpu:pydist,{device}:nccl\")")
        if name == "nccl" and not tdist.is_nccl_available():
            raise RuntimeError(f"init_process_group: {device}:nccl asked for, but this torch ({torch.__version__}) "
                               "has no NCCL (torch.distributed.is_nccl_available() is False); write "
                               f"\"cpu:pydist,{device}:gloo\" or \"pydist\"")
    return chosen


def make_backend(name: str, device: str, store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    """torch's ``name`` backend for ``device`` tensors of a group, on ``store`` (the group's
    store, which this prefixes with "<device>/pydist/"). Blocks until every member made it."""
    device_store = tdist.PrefixStore(f"{device}/pydist/", store)
    if name == "gloo":
        backend = tdist.ProcessGroupGloo(device_store, rank, size, timeout)
    else:
        options = tdist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        backend = tdist.ProcessGroupNCCL(device_store, rank, size, options)
    backend._set_sequence_number_for_group()
    return backend


def tensors_in(args: Iterable[Any]) -> list[torch.Tensor]:
    """Every tensor in an operation's arguments (tensors, lists of them, lists of lists)."""
    found: list[torch.Tensor] = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            found.append(arg)
        elif isinstance(arg, (list, tuple)):
            found.extend(tensors_in(arg))
    return found


def device_of(operation: str, tensors: list[torch.Tensor]) -> str:
    """The device type all ``tensors`` of one call are on ("cpu" for none); ValueError when they mix.
    Every call of the plugin asks: the all-CPU case reads ``is_cpu`` (0.15 us a tensor here,
    ``device.type`` 0.9 us)."""
    if all(t.is_cpu for t in tensors):
        return "cpu"
    kinds = {t.device.type for t in tensors}
    if len(kinds) > 1:
        places = ", ".join(sorted({str(t.device) for t in tensors}))
        raise ValueError(f"{operation}: tensors on {places} in one call; a call's tensors must be on one device "
                         "type (move them with .to(device) first)")
    return kinds.pop() if kinds else "cpu"


#: The coalesced operations torch's Backend does not offer from Python: run pair by pair.
PAIR_BY_PAIR = {"allgather_into_tensor_coalesced": "_allgather_base",
                "reduce_scatter_tensor_coalesced": "_reduce_scatter_base"}


def forward(backend: Any, operation: str, args: tuple) -> Any:
    """``backend.<operation>(*args)``, torch's Work back; option objects left out (None) take
    the backend's defaults; PAIR_BY_PAIR's operations run one call per (output, input) pair
    and return one Work for them all."""
    while args and args[-1] is None:
        args = args[:-1]
    if operation not in PAIR_BY_PAIR:
        return getattr(backend, operation)(*args)
    outputs, inputs, *options = args
    works = [getattr(backend, PAIR_BY_PAIR[operation])(out, inp, *options) for out, inp in zip(outputs, inputs)]
    return _create_work_from_future(torch.futures.collect_all([work.get_future() for work in works]))
