"""Point-to-point operations: send, recv, isend, irecv, P2POp and batch_isend_irecv.

They bypass the group's operation queue and go straight to the transport, so every
isend/irecv progresses on its own: an irecv posted before the matching isend never
deadlocks, and batch_isend_irecv posts all receives before any send. Messages between a
pair match by tag, in order. ``recv(src=None)`` takes a message from any rank of the group
and returns the sender's global rank.
"""
from __future__ import annotations

from typing import Any, Callable

from ._buffers import Buffer, as_buffer
from ._comm import with_context
from ._errors import DistBackendError
from ._group import ProcessGroup
from ._init import resolve_group, warn_non_member
from ._work import Work
from ._collectives import root_rank

_ANY = object()


class P2PWork(Work):
    """Work of one isend/irecv; ``wait()`` without a timeout waits the group's timeout."""

    def __init__(self, description: str, group: ProcessGroup, request, buffer: Buffer | None, peer: int | None):
        super().__init__(description, [buffer.obj] if buffer is not None else [])
        self._group = group
        self._request = request
        self._peer = peer
        request.add_callback(lambda r: self._done(r, buffer))

    def _done(self, request, buffer: Buffer | None) -> None:
        if request.error is not None:
            self._fail(with_context(request.error, self.description))
            return
        if buffer is not None:
            buffer.finish()
        source = request.source
        self._succeed(None if source is None else source)

    def wait(self, timeout: Any = None) -> bool:
        if timeout is None:
            seconds = self._group.timeout
            if not self._request.wait(seconds):
                self._group.backend.cancel(self._request)
                peer = "any rank" if self._peer is None else f"rank {self._peer}"
                raise DistBackendError(f"{self.description} timed out after {seconds:g} s waiting for {peer}")
        return super().wait(timeout)


def _peer(group: ProcessGroup, rank: int | None, group_rank: int | None, name: str) -> int:
    peer = root_rank(group, rank, group_rank, name)
    if peer == group.rank():
        raise ValueError(f"{name}: rank {group.ranks[peer]} is this rank; it cannot {'send to' if name == 'dst' else 'receive from'} itself")
    return peer


def _check_tag(tag: Any) -> int:
    if not isinstance(tag, int) or isinstance(tag, bool):
        raise TypeError(f"tag: expected an int, got {type(tag).__name__}")
    if not -(1 << 63) <= tag < (1 << 63):
        raise ValueError(f"tag: {tag} does not fit in 64 bits")
    return tag


def isend(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0,
          group_dst: int | None = None) -> Work | None:
    """Start sending ``tensor`` to rank ``dst``; the tensor must not change until done."""
    target = resolve_group(group)
    if target is None:
        warn_non_member("isend")
        return None
    peer = _peer(target, dst, group_dst, "dst")
    buf = as_buffer(tensor, "tensor", writable=False)
    request = target.backend.isend(buf.array, peer, _check_tag(tag))
    return P2PWork(f"send to rank {target.ranks[peer]} (tag {tag})", target, request, None, target.ranks[peer])


def irecv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
          group_src: int | None = None) -> Work | None:
    """Start receiving into ``tensor`` from rank ``src`` (None: any rank of the group)."""
    target = resolve_group(group)
    if target is None:
        warn_non_member("irecv")
        return None
    peer = None if src is None and group_src is None else _peer(target, src, group_src, "src")
    buf = as_buffer(tensor, "tensor")
    request = target.backend.irecv(buf.array, peer, _check_tag(tag))
    who = "any rank" if peer is None else f"rank {target.ranks[peer]}"
    return P2PWork(f"recv from {who} (tag {tag})", target, request, buf,
                   None if peer is None else target.ranks[peer])


def send(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> None:
    """Send ``tensor`` to rank ``dst``; returns when the data is on its way."""
    work = isend(tensor, dst, group, tag, group_dst)
    if work is not None:
        work.wait()


def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0,
         group_src: int | None = None) -> int:
    """Receive into ``tensor`` from ``src`` (None: any rank); returns the sender's global rank."""
    work = irecv(tensor, src, group, tag, group_src)
    if work is None:
        return -1
    work.wait()
    return work.source_rank()


class P2POp:
    """One operation of a batch_isend_irecv: ``P2POp(isend|irecv, tensor, peer, group, tag)``."""

    def __init__(self, op: Callable, tensor: Any, peer: int | None = None, group: Any = None, tag: int = 0,
                 group_peer: int | None = None):
        if op not in (isend, irecv):
            raise ValueError("op: expected pydist.isend or pydist.irecv (the functions themselves)")
        if peer is None and group_peer is None:
            raise ValueError("peer: required (or group_peer)")
        self.op, self.tensor, self.peer, self.group, self.tag, self.group_peer = op, tensor, peer, group, tag, group_peer

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
