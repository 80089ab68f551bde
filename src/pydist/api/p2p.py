"""Point-to-point operations: send, recv, isend, irecv, P2POp and batch_isend_irecv.

They bypass the group's operation queue and go straight to the transport, so every
isend/irecv progresses on its own: an irecv posted before the matching isend never
deadlocks, and batch_isend_irecv posts all receives before any send. Messages between a
pair match by tag, in order. ``recv(src=None)`` takes a message from any rank of the group
and returns the sender's global rank.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from ..algorithms.comm import with_context
from ..core.buffers import Buffer, DeviceTensorError, as_buffer
from ..core.deadline import timed_wait
from ..core.errors import DistBackendError, timed_out_waiting
from ..groups.device_engines import opt_in
from ..groups.device_work import DeviceWork
from ..groups.process_group import ProcessGroup
from ..groups.work import Work
from . import device_p2p
from .collectives import root_rank
from .groups import member_group


class _Posted(NamedTuple):
    """A send or receive handed to the transport: what waiting on it needs."""
    group: ProcessGroup
    request: Any
    buffer: Buffer | None  # a receive's buffer (staged copies are written back when done)
    peer: int | None  # global rank, None for any source
    tag: int

    @property
    def description(self) -> str:
        """'send to rank 1 (tag 0)', 'recv from any rank (tag 3)': formatted only when needed."""
        if self.buffer is None:
            return f"send to rank {self.peer} (tag {self.tag})"
        return f"recv from {'any rank' if self.peer is None else f'rank {self.peer}'} (tag {self.tag})"


def _wait(posted: _Posted, timeout: float | None = None) -> None:
    """Wait for a posted operation (default: the group's timeout); raise naming the peer,
    through the group's failure path."""
    seconds = posted.group.timeout if timeout is None else timeout
    if not timed_wait(posted.request.wait, seconds):
        posted.group.engine.cancel(posted.request)
        peer = "any rank" if posted.peer is None else f"rank {posted.peer}"
        error: BaseException = DistBackendError(f"{posted.description}: {timed_out_waiting(seconds)} for {peer}")
    elif posted.request.error is not None:
        error = with_context(posted.request.error, posted.description)
    else:
        return
    raise posted.group.failures.point_to_point(error)


class P2PWork(Work):
    """Work of one isend/irecv; ``wait()`` without a timeout waits the group's timeout."""

    def __init__(self, posted: _Posted):
        super().__init__(posted.description, [posted.buffer.obj] if posted.buffer is not None else [])
        self._posted = posted
        posted.request.add_callback(self._on_request)

    def _on_request(self, request) -> None:
        if request.error is not None:
            self._fail(with_context(request.error, self.description))
            return
        if self._posted.buffer is not None:
            self._posted.buffer.write_back()
        self._succeed(request.source)

    def wait(self, timeout: Any = None) -> bool:
        if timeout is None:
            _wait(self._posted)
        return super().wait(timeout)


def _peer(group: ProcessGroup, rank: int | None, group_rank: int | None, name: str) -> int:
    peer = root_rank(group, rank, group_rank, name)
    if peer == group.rank():
        verb = "send to" if name == "dst" else "receive from"
        raise ValueError(f"{name}: rank {group.ranks[peer]} is this rank; it cannot {verb} itself")
    return peer


def _check_tag(tag: Any) -> int:
    if not isinstance(tag, int) or isinstance(tag, bool):
        raise TypeError(f"tag: expected an int, got {type(tag).__name__}")
    if not -(1 << 63) <= tag < (1 << 63):
        raise ValueError(f"tag: {tag} does not fit in 64 bits")
    return tag


def _post_send(tensor: Any, dst: int | None, group: Any, tag: int, group_dst: int | None,
               op: str) -> _Posted | DeviceWork | None:
    target = member_group(group, op)
    if target is None:
        return None
    peer = _peer(target, dst, group_dst, "dst")
    try:
        buf = as_buffer(tensor, "tensor", writable=False)
    except DeviceTensorError:
        opt_in(target, tensor, "tensor")
        return device_p2p.post(target, tensor, peer, _check_tag(tag), True, op == "isend")
    request = target.engine.isend(buf.array, peer, _check_tag(tag))
    return _Posted(target, request, None, target.ranks[peer], tag)


def _post_recv(tensor: Any, src: int | None, group: Any, tag: int, group_src: int | None,
               op: str) -> _Posted | DeviceWork | None:
    target = member_group(group, op)
    if target is None:
        return None
    peer = None if src is None and group_src is None else _peer(target, src, group_src, "src")
    try:
        buf = as_buffer(tensor, "tensor")
    except DeviceTensorError:
        opt_in(target, tensor, "tensor")
        return device_p2p.post(target, tensor, peer, _check_tag(tag), False, op == "irecv")
    request = target.engine.irecv(buf.array, peer, _check_tag(tag))
    return _Posted(target, request, buf, None if peer is None else target.ranks[peer], tag)


def isend(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> Work | None:
    """Start sending ``tensor`` to rank ``dst``; the tensor must not change until done."""
    posted = _post_send(tensor, dst, group, tag, group_dst, "isend")
    return posted if posted is None or isinstance(posted, DeviceWork) else P2PWork(posted)


def irecv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> Work | None:
    """Start receiving into ``tensor`` from rank ``src`` (None: any rank of the group)."""
    posted = _post_recv(tensor, src, group, tag, group_src, "irecv")
    return posted if posted is None or isinstance(posted, DeviceWork) else P2PWork(posted)


def send(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> None:
    """Send ``tensor`` to rank ``dst``; returns when the data is on its way."""
    posted = _post_send(tensor, dst, group, tag, group_dst, "send")
    if isinstance(posted, DeviceWork):
        device_p2p.wait(posted)
    elif posted is not None:
        _wait(posted)


def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
         group_src: int | None = None) -> int:
    """Receive into ``tensor`` from ``src`` (None: any rank); returns the sender's global rank."""
    posted = _post_recv(tensor, src, group, tag, group_src, "recv")
    if posted is None:
        return -1
    if isinstance(posted, DeviceWork):
        device_p2p.wait(posted)
        source = posted.source_rank()
        assert source is not None  # a completed receive's
        return source
    _wait(posted)
    assert posted.buffer is not None  # a receive's
    posted.buffer.write_back()
    return posted.request.source


class P2POp:
    """One operation of a batch_isend_irecv: ``P2POp(isend|irecv, tensor, peer, group, tag)``."""

    def __init__(self, op: Callable, tensor: Any, peer: int | None = None, group: Any = None, tag: int = 0,
                 group_peer: int | None = None):
        if op not in (isend, irecv):
            raise ValueError("op: expected pydist.isend or pydist.irecv (the functions themselves)")
        if peer is None and group_peer is None:
            raise ValueError("peer: required (or group_peer)")
        self.op, self.tensor, self.peer, self.group = op, tensor, peer, group
        self.tag, self.group_peer = tag, group_peer

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """Start every operation (receives first) and return their Works in list order."""
    if not isinstance(p2p_op_list, list) or not all(isinstance(p, P2POp) for p in p2p_op_list):
        raise TypeError("p2p_op_list: expected a list of P2POp")
    if not p2p_op_list:
        raise ValueError("p2p_op_list: expected at least one P2POp")
    works: list[Work | None] = [None] * len(p2p_op_list)
    order = sorted(range(len(p2p_op_list)), key=lambda i: p2p_op_list[i].op is isend)
    for index in order:
        p = p2p_op_list[index]
        if p.op is isend:
            works[index] = isend(p.tensor, p.peer, p.group, p.tag, p.group_peer)
        else:
            works[index] = irecv(p.tensor, p.peer, p.group, p.tag, p.group_peer)
    return [w for w in works if w is not None]
