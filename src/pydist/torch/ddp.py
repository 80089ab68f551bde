"""pydist's DistributedDataParallel: torch's DDP for CPU modules, on pydist's collectives.

``DistributedDataParallel(module, process_group=None, bucket_cap_mb=None, ...)`` wraps an
``nn.Module`` as torch's DDP does:

- Construction checks that every rank wraps the same model (names, shapes, dtypes; a
  difference names the tensor and the ranks), then broadcasts parameters and buffers from
  rank 0 of the group. A CUDA module (every tensor on one device) runs on pydist's device
  engine, once asked for (PYDIST_CUDA_ENGINE=1: pydist.api.device_collectives): buckets on
  its device, each all_reduce async on the group's stream, the waits stream waits, as
  torch's DDP on NCCL; other devices raise ValueError.
- Backward averages gradients (sum / world size) in buckets filled in reverse registration
  order: the first bucket holds up to 1 MiB (``_DEFAULT_FIRST_BUCKET_BYTES``), the others
  ``bucket_cap_mb`` (default 25). Each bucket is ONE async all_reduce launched from the
  autograd hooks as soon as its last gradient is ready, in bucket order on every rank, so
  communication overlaps the rest of backward (see ``_ddp_reducer``).
- ``no_sync()``, ``register_comm_hook(state, hook)`` (hooks in ``pydist.torch.hooks``),
  ``find_unused_parameters``, ``gradient_as_bucket_view``, ``join()`` for uneven inputs
  (``_ddp_join``), ``broadcast_buffers`` (buffers from rank 0 before each forward),
  ``comm_stats()``; ``state_dict()`` keys carry torch's ``module.`` prefix.

Differences from torch, all deliberate:

- Buckets follow reverse registration order from the first iteration with the small bucket
  first (torch starts in registration order and rebuilds once in observed gradient order
  after the first iteration; pydist does not rebuild). A first bucket is small whatever
  ``bucket_cap_mb`` is: ``min(1 MiB, bucket cap)``.
- ``static_graph`` is accepted and has no effect: buckets never change anyway, and
  unused parameters still need ``find_unused_parameters=True``.
- With find_unused_parameters, outputs that take no part in the loss need no ``_DDPSink``:
  the end-of-backward callback marks whatever got no gradient as ready.
- ``join()`` is DDP's own context manager; torch's generic ``Join([...])`` drives torch's
  collectives on torch's process groups and does not apply to pydist groups.
- ``register_comm_hook`` swaps torch's default hooks (allreduce, fp16/bf16 compress) for
  pydist's (``pydist.torch.hooks``); other torch hooks run as they are, on torch's groups.
- device_ids/output_device may only name the module's own device (one device per
  module); ``bucket_cap_mb=None`` means 25, as in torch.

Sparse gradients (``nn.Embedding``/``nn.EmbeddingBag`` with ``sparse=True``) are averaged as
torch's reducer does: each such weight has a bucket of its own, its gradient is divided in
place and reduced by a sparse all_reduce (gloo's algorithm, ``pydist.api.sparse``), and
stays a sparse ``.grad``.
"""
from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch

import pydist as dist

from ..groups.device_engines import opt_in
from ._ddp_bucket import DEFAULT_BUCKET_CAP_MB, DEFAULT_FIRST_BUCKET_BYTES, assign_buckets
from ._ddp_join import Join, JoinConfig, notify_still_training, vote_backward_sync
from ._ddp_reducer import Reducer
from ._ddp_sync import broadcast_coalesced, find_common_rank, find_tensors, verify_same_model
from .hooks import DEFAULT_HOOKS, check_state, pydist_equivalent

__all__ = ["DistributedDataParallel", "_DEFAULT_FIRST_BUCKET_BYTES"]

_DEFAULT_FIRST_BUCKET_BYTES = DEFAULT_FIRST_BUCKET_BYTES
_MB = 1024 * 1024


def _module_device(module: torch.nn.Module, group: Any, device_ids: list[int] | None,
                   output_device: Any) -> torch.device:
    """The one device of ``module``'s tensors: the CPU, or a CUDA device when the group may
    run CUDA tensors (ValueError, saying how to ask, when it may not); ValueError for other
    devices, a module on two, or device_ids/output_device naming another device."""
    devices: dict[torch.device, str] = {}
    for name, tensor in itertools.chain(module.named_parameters(), module.named_buffers()):
        devices.setdefault(tensor.device, name)
    if len(devices) > 1:
        named = ", ".join(f"'{name}' on {device}" for device, name in devices.items())
        raise ValueError(f"DistributedDataParallel: a module on one device only, got {named}")
    device = next(iter(devices), torch.device("cpu"))
    if device.type == "cuda":
        opt_in(group, next(t for t in itertools.chain(module.parameters(), module.buffers())), f"'{devices[device]}'")
    elif device.type != "cpu":
        raise ValueError(f"pydist's DistributedDataParallel runs CPU and CUDA modules, but '{devices[device]}' is on "
                         f"{device}; move the module with module.cpu()")
    asked = [*(device_ids or []), *([] if output_device is None else [output_device])]
    if any((torch.device("cuda", i) if isinstance(i, int) else torch.device(i)) != device for i in asked):
        raise ValueError(f"DistributedDataParallel device_ids/output_device ({device_ids}, {output_device}) must "
                         f"name the module's own device, {device} (pydist's DDP runs one device per module)")
    return device


def _sparse_gradient_weights(module: torch.nn.Module) -> set[int]:
    """ids of the parameters whose gradients are sparse (torch's ``produces_sparse_gradient``)."""
    return {id(sub.weight) for sub in module.modules()
            if isinstance(sub, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and sub.sparse}


class DistributedDataParallel(torch.nn.Module):
    """Data-parallel training of a CPU or CUDA module over a pydist process group (torch's DDP API).

    Raises ValueError for a module on another device than the CPU or CUDA (CUDA: when not
    asked for), or one that differs across ranks, RuntimeError
    when no parameter requires a gradient, TypeError for a group that is not pydist's.
    """

    def __init__(self, module: torch.nn.Module, process_group: Any = None, bucket_cap_mb: float | None = None,
                 broadcast_buffers: bool = True, find_unused_parameters: bool = False,
                 gradient_as_bucket_view: bool = False, static_graph: bool = False, *,
                 device_ids: list[int] | None = None, output_device: Any = None, init_sync: bool = True):
        super().__init__()
        if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
            raise TypeError(f"process_group: expected a pydist ProcessGroup (pydist.new_group) or None, got "
                            f"{type(process_group).__name__}")
        if bucket_cap_mb is not None and not bucket_cap_mb > 0:
            raise ValueError(f"bucket_cap_mb: expected a positive size in MiB, got {bucket_cap_mb}")
        group = process_group if process_group is not None else dist.group.WORLD
        if group is None:
            raise ValueError("Default process group has not been initialized, please make sure to call "
                             "init_process_group.")
        self.process_group: dist.ProcessGroup = group
        self.module = module
        self.parameters_to_ignore = set(getattr(module, "_ddp_params_and_buffers_to_ignore", ()))
        self.device = _module_device(module, group, device_ids, output_device)
        named = [(name, p) for name, p in self._named_params() if p.requires_grad]
        if not named:
            raise RuntimeError("DistributedDataParallel is not needed when a module doesn't have any parameter "
                               "that requires a gradient.")
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._join_config = JoinConfig()
        self._forward_started = False

        states = self._named_params() + (self._named_buffers() if broadcast_buffers else [])
        verify_same_model(states, self.process_group)
        if init_sync:
            broadcast_coalesced([t for _, t in states], self.process_group, 0)
        cap = int((DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * _MB)
        params = [p for _, p in named]
        sparse_ids = _sparse_gradient_weights(module)
        sparse = frozenset(i for i, p in enumerate(params) if id(p) in sparse_ids)
        order = list(range(len(params)))[::-1]  # gradients become ready in reverse registration order
        self.bucket_indices = assign_buckets(params, order, min(DEFAULT_FIRST_BUCKET_BYTES, cap), cap, sparse)
        self.reducer = Reducer(params, [name for name, _ in named], self.process_group, self.bucket_indices,
                               find_unused_parameters, gradient_as_bucket_view, sparse)

    # -- what DDP manages -----------------------------------------------------------------
    def _named_params(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, p) for n, p in self.module.named_parameters() if n not in self.parameters_to_ignore]

    def _named_buffers(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, b) for n, b in self.module.named_buffers() if n not in self.parameters_to_ignore]

    def _module_buffers(self) -> list[torch.Tensor]:
        """Re-read each time: a module may reassign its buffers."""
        return [b for _, b in self._named_buffers()]

    # -- forward --------------------------------------------------------------------------
    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        self._forward_started = True
        grad_enabled = torch.is_grad_enabled()
        if grad_enabled:
            self.reducer.ensure_prior_reduction_finished()
        joining = self._join_config.enable
        if joining:
            notify_still_training(self)
        if self.will_sync_module_buffers():
            self._sync_buffers()
        if joining:
            vote_backward_sync(self, joined=False)
        output = self.module(*inputs, **kwargs)
        if grad_enabled and self.require_backward_grad_sync:
            self.require_forward_param_sync = True
            self.reducer.prepare_for_backward(find_tensors(output) if self.find_unused_parameters else [])
        else:
            self.require_forward_param_sync = False
            if grad_enabled:
                self.reducer.expect_hooks = False  # a backward of this forward must not sync
        return output

    def will_sync_module_buffers(self) -> bool:
        """True when the next forward broadcasts buffers from rank 0 (torch's name)."""
        return self.require_forward_param_sync and self.broadcast_buffers and bool(self._module_buffers())

    def _sync_buffers(self) -> None:
        """Buffers from rank 0 (inside join(): from the highest-ranked rank still training)."""
        source = find_common_rank(self.process_group, True) if self._join_config.enable else 0
        buffers = self._module_buffers()
        with torch.autograd._unsafe_preserve_version_counter(tuple(buffers)):
            broadcast_coalesced(buffers, self.process_group, source)

    # -- torch's DDP API ------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Forward/backward inside accumulate gradients locally; the next synced backward averages the sum."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False) -> Join:
        """Context manager for uneven inputs: ranks out of data shadow the others' collectives."""
        return Join(self, divide_by_initial_world_size, enable, throw_on_early_termination)

    def register_comm_hook(self, state: Any, hook: Callable) -> None:
        """Reduce buckets with ``hook(state, bucket) -> torch.futures.Future[Tensor]`` (once, before forward).

        torch's default hooks (allreduce, fp16/bf16 compress) are replaced by pydist's
        equivalents, which need ``state`` to be a pydist ProcessGroup or None.
        """
        if not callable(hook):
            raise TypeError("Communication hook must be callable.")
        if self.reducer.comm_hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        if self._forward_started:
            raise RuntimeError("register_comm_hook must be called before the first forward pass (DDP "
                               "communication hook can only be registered once and should be registered before "
                               "calling backward).")
        equivalent = pydist_equivalent(hook)
        if equivalent in DEFAULT_HOOKS:
            check_state(state)
        self.reducer.comm_hook, self.reducer.comm_state = equivalent, state

    def comm_stats(self) -> dict[str, Any]:
        """Gradient reductions so far: bytes_reduced, seconds_communicating (wall time with at
        least one bucket in flight), allreduces (buckets reduced, shadowed ones included)."""
        return dict(self.reducer.stats)

    def _get_bucket_params(self) -> list[list[str]]:
        """Parameter names per bucket, in launch order (for inspection and tests)."""
        return [[self.reducer.names[i] for i in bucket] for bucket in self.bucket_indices]
