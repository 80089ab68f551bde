"""The one accept loop of every listener (the store server, each rank's), with one policy
for its errors, and the launcher's descriptor limit.

:func:`accept_ready` takes what waits on a non-blocking listener, ``BATCH`` connections at
most per call (so a burst's first bytes are read before more come in). Out of file
descriptors (EMFILE, ENFILE; ENOBUFS, ENOMEM: out of kernel memory) it has its listener
drop the unproven connection its admission policy names first (the oldest of those with the
least progress, :meth:`~pydist.net.admission.Gate.victim`) and accepts again; with none to drop, it reports the
error (``failed``: the listener logs it, rate limited) and pauses ``BACKOFF_SECONDS`` (the
connection still waits: accepting again at once would spin). A connection that ended while
it waited (ECONNABORTED, EPROTO, ...) is skipped. Any other error is reported and paused on
the same way; nothing is raised, so a listener never dies of its accept.
"""
from __future__ import annotations

import errno
import resource
import socket
import time
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from .admission import Gate

#: connections accepted per call at most (then the loop reads what the others sent)
BATCH = 64
#: seconds a listener pauses after an accept failed with nothing to drop (real time: for
#: the CPU's sake, not a timeout)
BACKOFF_SECONDS = 0.05
#: out of descriptors or kernel memory: dropping an unproven connection may free one
SHORT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: the connection ended or was refused while it waited: skip it (Linux passes these on, see accept(2))
GONE = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.ENETDOWN, errno.ENOPROTOOPT,
                  errno.EHOSTDOWN, errno.ENONET, errno.EHOSTUNREACH, errno.EOPNOTSUPP, errno.ENETUNREACH})


Key = TypeVar("Key", bound=Hashable)


def accept_ready(listener: socket.socket, admit: Callable[[socket.socket, Any], None], gate: Gate[Key],
                 drop: Callable[[Key, str], None], failed: Callable[[OSError], None]) -> None:
    """Accept up to BATCH connections waiting on ``listener`` (non-blocking), each handed to
    ``admit(sock, address)`` (non-blocking, TCP_NODELAY); see the module for the errors:
    ``drop(key, why)`` drops a connection of the listener's ``gate``, ``failed(error)``
    reports an error."""
    for _ in range(BATCH):
        try:
            sock, address = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as error:
            if error.errno in GONE:
                continue
            victim = gate.victim() if error.errno in SHORT else None
            if victim is not None:
                drop(victim, f"dropped to accept a new connection: this process is out of descriptors ({error})")
                continue
            failed(error)
            time.sleep(BACKOFF_SECONDS)
            return
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        admit(sock, address)


def raise_descriptor_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (a process hosting a store
    holds a descriptor per client; an idle flood should meet the admission's cap first);
    the soft limit now. Never raises: a limit that cannot be changed is left as it is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            return hard
        except (ValueError, OSError):
            pass
    return soft
