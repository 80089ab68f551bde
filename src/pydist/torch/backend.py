"""The torch.distributed plugin: ``ProcessGroupPydist``, a ``torch.distributed.ProcessGroup``
subclass over pydist (registered, and made for each torch group, by registration).

The default group gets a pydist World of its own, met through torch's store, and each
new_group is a group of that world, as pydist's own new_group is (placement: the cases that
get a private world), on the engine its options chose (options). Every method maps torch's
call (tensor lists, option objects) onto pydist's operations and returns a torch Work (a
``torch.distributed.Work`` subclass: see work), so torch's own async handling, DDP's
bucketing and ``wait()`` work unchanged. A blocking call (its options' ``asyncOp`` False)
runs as pydist's own blocking calls do, in the calling thread on an idle group, raises its
error there and returns no Work (torch then takes it as done); an async one is queued (see
calls). Point-to-point goes to the transport at
once, as pydist's does. Tensors on another device (CUDA) go to the torch
backend the group made for it ("cpu:pydist,cuda:gloo", ``Options(cuda=...)``, PYDIST_CUDA:
see devices), or to pydist's own CUDA engine when asked for ("cpu:pydist,cuda:pydist",
PYDIST_CUDA_ENGINE=1: pydist.api.device_collectives), else are refused with a clear error at
the call. torch's functional
collectives (DTensor, FSDP2) reach this backend through the same methods. While torch's
profiler runs, each operation records an event "pydist:<op>" named as gloo names its own
(see _profiling).
"""
from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as tdist

import pydist

from ..api.groups import timeout_seconds
from ..core.ops import RedOpType
from ..groups.device_engines import allowed
from ..groups.process_group import ProcessGroup
from ..groups.work import Work
from ..groups.world import World
from ._profiling import (
    all_reduce_title,
    first_argument,
    first_input_list,
    no_inputs,
    profiled,
    scattered,
    second_argument,
    single_input,
)
from .calls import asks_async, operation, pydist_op, torch_work
from .devices import device_of, tensors_in
from .placement import place, release
from .work import PydistWork

BACKEND_NAME = "pydist"
STAGED_P2P = ("send", "recv", "recv_anysource")  # pydist runs these through host memory rather than gloo


def _member_work(work: Work | None) -> Work:
    """An async collective's Work (None only for non-members; this plugin's group holds every rank)."""
    assert work is not None
    return work


class ProcessGroupPydist(tdist.ProcessGroup):
    """A torch ProcessGroup whose every operation runs on pydist."""

    profiling_name = BACKEND_NAME  # the prefix of its torch profiler events ("pydist:all_reduce")
    # What torch asks of the backend of a device (see _get_backend): this group, as its own CPU
    # backend, batches no point-to-point operations (torch then runs batch_isend_irecv's one by
    # one), and splits, shrinks and estimates through none of torch's backend calls.
    supports_coalescing = supports_splitting = supports_shrinking = supports_time_estimate = False

    def __init__(self, store, rank: int, size: int, timeout: timedelta, engine: str = "pydist",
                 global_ranks: list[int] | None = None, world: World | None = None,
                 group: ProcessGroup | None = None):
        """The group's world and pydist group are made (placement.place), or given: ``world``
        (a shrunk or grown one) and its ``group`` (default: its default group)."""
        super().__init__(rank, size)
        if world is None:
            world, group = place(store, rank, size, timeout.total_seconds(), engine, global_ranks)
        self._world: World | None = world  # None once shut down
        self._group: ProcessGroup | None = group or world.default_group
        self.engine = engine
        self._name = ""
        self._desc = ""
        self.device_backends: dict[str, Any] = {}  # device type -> the torch backend running its tensors

    def attach(self, device: str, backend: Any) -> None:
        """Run ``device``'s tensors on ``backend`` (a torch backend of the same members),
        registered as torch registers a group's backends."""
        kind = getattr(tdist.ProcessGroup.BackendType, backend.name().upper(), tdist.ProcessGroup.BackendType.CUSTOM)
        self._register_backend(torch.device(device), kind, backend)
        self.device_backends[device] = backend

    def _get_backend(self, device: Any) -> Any:
        """torch's "backend of this group for ``device``": the torch backend attached for it, else,
        for the CPU, this group itself (pydist runs CPU tensors; torch 2.14's batch_isend_irecv
        asks it whether it coalesces). Other devices without a backend: torch's RuntimeError."""
        try:
            return super()._get_backend(device)
        except RuntimeError:
            if torch.device(device).type != "cpu" and not self._runs_cuda(torch.device(device)):
                raise
            return self

    def _runs_cuda(self, device: Any) -> bool:
        """Whether pydist's own CUDA engine runs this group's ``device`` tensors."""
        return device.type == "cuda" and self._group is not None and allowed(self._group)

    get_backend = _get_backend  # torch 2.14's public name (its get_backend_impl asks it)

    def supports_tensor_alloc(self, device: Any) -> bool:
        """Whether this backend allocates tensors itself (FSDP2 asks): no."""
        return False

    def set_timeout(self, timeout: timedelta) -> None:
        """Make ``timeout`` the default timeout of the group's later operations, on pydist and on
        the backends attached for other devices (torch 2.14's ``set_timeout`` calls this).
        ValueError for a timeout that is not positive, AttributeError on a torch whose
        ProcessGroup has no ``set_timeout``: both before anything changed."""
        seconds = timeout_seconds(timeout)
        if not hasattr(tdist.ProcessGroup, "set_timeout"):
            raise AttributeError(f"set_timeout: this torch ({torch.__version__}) has no ProcessGroup.set_timeout; "
                                 "pydist.set_timeout(timeout, group.pydist_group) sets pydist's half")
        self.pydist_group.set_timeout(seconds)
        super().set_timeout(timeout)

    def route(self, operation: str, args: tuple) -> Any:
        """The torch backend that runs this call's tensors, or None for pydist (CPU tensors, and
        point-to-point where the device's backend is gloo: staged through host memory);
        ValueError when they mix devices or sit on a device the group has no backend for."""
        device = device_of(operation, tensors_in(args))
        if device == "cpu":
            return None
        backend = self.device_backends.get(device)
        if backend is None and self._runs_cuda(torch.device(device)):
            return None  # pydist's device engine (pydist.api.device_collectives)
        if backend is None:
            how = ("init_process_group(\"cpu:pydist,cuda:gloo\") or \"cpu:pydist,cuda:nccl\", or PYDIST_CUDA=gloo, "
                   "makes one; \"cpu:pydist,cuda:pydist\" or PYDIST_CUDA_ENGINE=1 runs them on pydist's own "
                   "engine; or move them with .cpu()" if device == "cuda" else "move them with .cpu()")
            raise ValueError(f"{operation}: a tensor on {device}; this group runs CPU tensors on pydist and has no "
                             f"backend for {device} tensors ({how})")
        return None if operation in STAGED_P2P and backend.name() == "gloo" else backend

    @property
    def pydist_group(self) -> ProcessGroup:
        """The pydist group this torch group runs on."""
        if self._group is None:
            raise ValueError(f"{self!r} was shut down (destroy_process_group)")
        return self._group

    @property
    def pydist_world(self) -> World:
        """The pydist world this torch group runs on (its transport, its store namespace): the
        default group's, or a private one (see placement)."""
        if self._world is None:
            raise ValueError(f"{self!r} was shut down (destroy_process_group)")
        return self._world

    def hand_over(self) -> World:
        """Give up this group's world (a shrink or a grow made a new group of it): shutting this
        group down no longer releases anything."""
        world = self.pydist_world
        self._world = self._group = None
        return world

    # -- identity -------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - torch's names
        """"pydist", as torch asks a backend."""
        return BACKEND_NAME

    def setGroupName(self, name: str) -> None:  # noqa: N802
        """Record the name torch gives the group."""
        self._name = name

    def getGroupName(self) -> str:  # noqa: N802
        """The name torch gave the group."""
        return self._name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        """Record the description torch gives the group."""
        self._desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802
        """The description torch gave the group."""
        return self._desc

    def __repr__(self) -> str:
        return f"ProcessGroupPydist(rank={self.rank()}, size={self.size()}, engine={self.engine!r})"

    # -- collectives ----------------------------------------------------------------------
    @operation(all_reduce_title, first_argument)
    def allreduce(self, tensors: list[torch.Tensor], opts=None) -> tdist.Work:
        op = pydist_op(opts.reduceOp) if opts is not None else RedOpType.SUM
        async_op = asks_async(opts)
        return torch_work(async_op, pydist.all_reduce(tensors[0], op, self._group, async_op), tensors)

    @operation("all_reduce", first_argument, several=True)
    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts=None) -> tdist.Work:
        """One all_reduce of the tensors flattened together, then copied back."""
        op = pydist_op(opts.reduceOp) if opts is not None else RedOpType.SUM
        flat = torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)
        work = pydist.all_reduce(flat, op=op, group=self._group, async_op=True)
        return PydistWork(work, tensors, after=lambda: _unflatten(flat, tensors))

    @operation("broadcast", first_argument)
    def broadcast(self, tensors: list[torch.Tensor], opts=None) -> tdist.Work:
        root = opts.rootRank if opts is not None else 0
        async_op = asks_async(opts)
        return torch_work(async_op, pydist.broadcast(tensors[0], group=self._group, async_op=async_op,
                                                     group_src=root), tensors)

    @operation("reduce", first_argument)
    def reduce(self, tensors: list[torch.Tensor], opts=None) -> tdist.Work:
        async_op = asks_async(opts)
        return torch_work(async_op, pydist.reduce(tensors[0], op=pydist_op(opts.reduceOp), group=self._group,
                                                  async_op=async_op, group_dst=opts.rootRank), tensors)

    @operation("all_gather", second_argument)
    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts=None) -> tdist.Work:
        async_op = asks_async(opts)
        work = pydist.all_gather(output_tensors[0], input_tensors[0], self._group, async_op)
        return torch_work(async_op, work, output_tensors)

    @operation("all_gather", single_input)
    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts=None) -> tdist.Work:
        async_op = asks_async(opts)
        return torch_work(async_op, pydist.all_gather_into_tensor(output, input, self._group, async_op), [output])

    all_gather_single = _allgather_base

    @operation("all_gather", second_argument, several=True)
    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], input_list: list[torch.Tensor],
                            opts=None) -> tdist.Work:
        """``output_lists[rank][j]`` receives ``input_list[j]`` of ``rank`` (torch's layout)."""
        works = [_member_work(pydist.all_gather([per_rank[j] for per_rank in output_lists], inp,
                                                group=self._group, async_op=True))
                 for j, inp in enumerate(input_list)]
        return PydistWork.all_of(works, output_lists)

    @operation("all_gather", second_argument, several=True)
    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts=None) -> tdist.Work:
        works = [_member_work(pydist.all_gather_into_tensor(o, i, group=self._group, async_op=True))
                 for o, i in zip(outputs, inputs)]
        return PydistWork.all_of(works, outputs)

    @operation("reduce_scatter", first_input_list)
    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts=None) -> tdist.Work:
        async_op = asks_async(opts)
        work = pydist.reduce_scatter(outputs[0], input_lists[0], pydist_op(opts.reduceOp), self._group, async_op)
        return torch_work(async_op, work, outputs)

    @operation("reduce_scatter", single_input)
    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts=None) -> tdist.Work:
        op = pydist_op(opts.reduceOp) if opts is not None else RedOpType.SUM
        async_op = asks_async(opts)
        return torch_work(async_op, pydist.reduce_scatter_tensor(output, input, op, self._group, async_op), [output])

    reduce_scatter_single = _reduce_scatter_base

    @operation("reduce_scatter", second_argument, several=True)
    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts=None) -> tdist.Work:
        op = pydist_op(opts.reduceOp) if opts is not None else RedOpType.SUM
        works = [_member_work(pydist.reduce_scatter_tensor(o, i, op=op, group=self._group, async_op=True))
                 for o, i in zip(outputs, inputs)]
        return PydistWork.all_of(works, outputs)

    @operation("all_to_all", single_input)
    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts=None) -> tdist.Work:
        async_op = asks_async(opts)
        work = pydist.all_to_all_single(output, input, output_split_sizes or None, input_split_sizes or None,
                                        self._group, async_op)
        return torch_work(async_op, work, [output])

    all_to_all_single = alltoall_base

    @operation("all_to_all", second_argument)
    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts=None) -> tdist.Work:
        async_op = asks_async(opts)
        return torch_work(async_op, pydist.all_to_all(output_tensors, input_tensors, self._group, async_op),
                          output_tensors)

    @operation("gather", second_argument)
    def gather(self, output_lists: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts=None) -> tdist.Work:
        root = opts.rootRank
        outs = output_lists[0] if self.rank() == root else None
        async_op = asks_async(opts)
        work = pydist.gather(input_tensors[0], outs, group=self._group, async_op=async_op, group_dst=root)
        return torch_work(async_op, work, output_lists)

    @operation("gather", single_input)
    def gather_single(self, output: torch.Tensor, input: torch.Tensor, opts=None) -> tdist.Work:
        """torch 2.14's gather into one tensor (``output``: the root's; an empty placeholder elsewhere)."""
        root = opts.rootRank if opts is not None else 0
        async_op = asks_async(opts)
        work = pydist.gather_single(input, output if self.rank() == root else None, group=self._group,
                                    async_op=async_op, group_dst=root)
        return torch_work(async_op, work, [output])

    @operation("scatter", scattered)
    def scatter(self, output_tensors: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                opts=None) -> tdist.Work:
        root = opts.rootRank
        ins = input_lists[0] if self.rank() == root else None
        async_op = asks_async(opts)
        work = pydist.scatter(output_tensors[0], ins, group=self._group, async_op=async_op, group_src=root)
        return torch_work(async_op, work, output_tensors)

    @profiled("barrier", no_inputs)
    def barrier(self, opts=None) -> tdist.Work:
        async_op = asks_async(opts)
        return torch_work(async_op, pydist.barrier(self._group, async_op), [])

    # -- point-to-point: on pydist, through host memory for another device's tensors where
    # that device's backend is gloo (gloo aborts the process on a CUDA send or recv) -------
    @operation("send", first_argument)
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> tdist.Work:
        tensor = _on_host(tensors[0]) if tensors[0].device.type in self.device_backends else tensors[0]
        return PydistWork(pydist.isend(tensor, group=self._group, group_dst=dst, tag=tag), tensors)

    @operation("recv", first_argument)
    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> tdist.Work:
        host, after = self._receiving(tensors[0])
        return PydistWork(pydist.irecv(host, group=self._group, group_src=src, tag=tag), tensors, after)

    @operation("recvAnySource", first_argument)
    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> tdist.Work:
        host, after = self._receiving(tensors[0])
        return PydistWork(pydist.irecv(host, group=self._group, tag=tag), tensors, after)

    def _receiving(self, tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None] | None]:
        """Where a receive lands: through host memory for a device a torch backend runs beside
        pydist (gloo's), else the tensor itself (CPU, or pydist's device engine)."""
        if tensor.device.type in self.device_backends:
            return _received_on_host(tensor)
        return tensor, None

    # -- lifetime -------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Release this group's pydist group, and its world where it is its own (torch's
        destroy_process_group; see placement.release)."""
        if self._world is not None and self._group is not None:
            release(self._world, self._group)
        self._world = self._group = None

    abort = shutdown


def _on_host(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself on the CPU, else a host copy made after the work queued before it."""
    return tensor if tensor.device.type == "cpu" else tensor.detach().to("cpu")


def _received_on_host(tensor: torch.Tensor) -> tuple[torch.Tensor, Callable[[], None] | None]:
    """Where a receive lands (the tensor itself on the CPU, else a host buffer) and what copies
    it into the tensor when the receive completes."""
    if tensor.device.type == "cpu":
        return tensor, None
    host = torch.empty_like(tensor, device="cpu")
    return host, lambda: tensor.copy_(host)


def _unflatten(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for tensor in tensors:
        count = tensor.numel()
        tensor.copy_(flat[offset:offset + count].view_as(tensor))
        offset += count
