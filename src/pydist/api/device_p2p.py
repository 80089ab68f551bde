"""send, recv, isend and irecv of device tensors: pydist.api.p2p hands a call here when its
tensor is on a device.

Each goes straight to the group's device engine (not through the group's queue, as host
point-to-point): pydist.algorithms.device_p2p moves it device to device through the sender's
buffer, chunk by chunk, driven by host messages, so sends and receives posted in any order
progress on their own (batch_isend_irecv included). A blocking send or recv enqueues its
work on the caller's current stream and returns once it is enqueued (recv: the sender's
global rank); isend and irecv go to the group's point-to-point stream after the caller's
work so far, and return a DeviceWork whose ``wait()`` (within the group's timeout) makes the
current stream wait. A failure or timeout takes the group's failure path, as host ones do.
"""
from __future__ import annotations

from typing import Any

from ..groups.device_work import DeviceWork
from ..groups.process_group import ProcessGroup
from ..groups.work import Work
from .device_args import checked, flat


def post(target: ProcessGroup, tensor: Any, peer: int | None, tag: int, sending: bool,
         async_op: bool) -> DeviceWork:
    """Start a send to (or a receive from) group rank ``peer``; its DeviceWork."""
    what = f"{'send to' if sending else 'recv from'} {'any rank' if peer is None else f'rank {target.ranks[peer]}'} " \
           f"(tag {tag})"
    engine, device, _ = checked(target, "isend" if sending else "irecv", [("tensor", tensor)])
    array = flat(device, tensor, "tensor")
    plan = engine.plan(async_op, p2p=True)
    host = Work(what, [tensor])
    ranks = target.ranks

    def enqueued(error: BaseException | None, source: int | None) -> None:
        if error is not None:
            host._fail(error)
        else:
            host._succeed(None if source is None else ranks[source])

    if sending:
        assert peer is not None
        engine.send(plan, array, peer, tag, what, enqueued)
    else:
        engine.recv(plan, array, peer, tag, what, enqueued)
    plan.arrays = [tensor]
    return DeviceP2PWork(target, host, device, plan, [tensor])


class DeviceP2PWork(DeviceWork):
    """A device send's or receive's Work: ``wait()`` without a timeout waits the group's; a
    failure takes the group's failure path (as host point-to-point)."""

    def __init__(self, target: ProcessGroup, host: Work, device: Any, plan: Any, outputs: list[Any]):
        super().__init__(host, device, plan, outputs, timeout=target.timeout)
        self.target = target

    def wait(self, timeout: Any = None) -> bool:
        try:
            return super().wait(timeout)
        except BaseException as error:
            raise self.target.failures.point_to_point(error) from error


def wait(work: DeviceWork) -> None:
    """A blocking send's or recv's wait (within the group's timeout)."""
    work.wait()
