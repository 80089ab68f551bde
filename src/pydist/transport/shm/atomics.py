"""Atomic operations and futexes on shared memory, through ctypes (no compiled code of ours).

Sequentially consistent read-modify-writes come from GCC's libatomic; loads and stores of
aligned words are plain on x86-64 (its TSO memory model keeps stores in order and loads in
order, and a locked read-modify-write is a full barrier) and go through libatomic with
acquire/release order elsewhere (aarch64). ``fence`` (x86-64 only) is that full barrier
without a ctypes call: taking and releasing a CPython lock runs a locked instruction
(glibc's semaphore or mutex), ~0.07 us where a libatomic call costs ~0.45 us. Futex wait/wake are the Linux syscall on a
32-bit word, shared between processes (not FUTEX_PRIVATE).

``available()`` is False when libatomic or the futex syscall is missing; pydist then keeps
to the tcp transport.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import platform
import threading
from typing import Any

_SEQ_CST, _ACQUIRE, _RELEASE = 5, 2, 3
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_SYS_FUTEX = {"x86_64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())
PLAIN_ORDERING = platform.machine() == "x86_64"


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load_libraries():
    """(libatomic, libc that releases the GIL, libc that keeps it). Atomics and futex wakes
    take nanoseconds, so they keep the GIL (PyDLL): releasing it would hand the interpreter
    to another thread at every call. Only futex_wait releases it."""
    try:
        atomic = ctypes.PyDLL(ctypes.util.find_library("atomic") or "libatomic.so.1")
        libc = ctypes.CDLL(None, use_errno=True)
        libc_holding = ctypes.PyDLL(None, use_errno=True)
    except OSError:
        return None
    signatures = (
        ("__atomic_fetch_add_4", [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int], ctypes.c_uint32),
        ("__atomic_exchange_8", [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int], ctypes.c_uint64),
        ("__atomic_load_8", [ctypes.c_void_p, ctypes.c_int], ctypes.c_uint64),
        ("__atomic_load_4", [ctypes.c_void_p, ctypes.c_int], ctypes.c_uint32),
        ("__atomic_store_8", [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int], None),
    )
    for name, args, result in signatures:
        function = getattr(atomic, name)
        function.argtypes, function.restype = args, result
    libc.syscall.restype = ctypes.c_long
    libc_holding.syscall.restype = ctypes.c_long
    return atomic, libc, libc_holding


# Any, not Optional: the functions below run only once available() said yes (no None check
# on the futex/atomic hot path), and a ctypes library's functions are dynamic attributes anyway.
_LIBS: Any = _load_libraries() if _SYS_FUTEX is not None else None


def available() -> bool:
    """True when shared-memory synchronisation works on this machine."""
    return _LIBS is not None and os.path.isdir("/dev/shm")


FENCE = threading.Lock()  # taken and released: a full barrier on x86-64 (see fence)


def fence() -> None:
    """x86-64 only (PLAIN_ORDERING): every store before it is visible to other cores before
    any load after it reads."""
    with FENCE:
        pass


def fetch_add_u32(address: int, value: int) -> int:
    """``*address += value`` (32-bit, wrapping), sequentially consistent; returns the old value."""
    return _LIBS[0].__atomic_fetch_add_4(address, value & 0xFFFFFFFF, _SEQ_CST)


def store_seq_cst(words: memoryview, base: int, index: int, value: int) -> None:
    """Word ``index`` of ``words`` (64-bit, mapped at ``base``) = ``value``, sequentially
    consistent: on x86-64 a plain store and ``fence`` (~0.3 us less than the exchange)."""
    if PLAIN_ORDERING:
        words[index] = value
        fence()
    else:
        _LIBS[0].__atomic_exchange_8(base + 8 * index, value, _SEQ_CST)


def load_u64_acquire(address: int) -> int:
    return _LIBS[0].__atomic_load_8(address, _ACQUIRE)


def load_u32_seq_cst(address: int) -> int:
    return _LIBS[0].__atomic_load_4(address, _SEQ_CST)


def store_u64_release(address: int, value: int) -> None:
    _LIBS[0].__atomic_store_8(address, value, _RELEASE)


def futex_wait(address: int, expected: int, timeout: float) -> None:
    """Sleep while the 32-bit word at ``address`` equals ``expected``, at most ``timeout`` s
    (returns early on a wake, a changed word or a signal)."""
    seconds = int(timeout)
    spec = _Timespec(seconds, int((timeout - seconds) * 1e9))
    result = _LIBS[1].syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAIT, ctypes.c_uint32(expected),
                              ctypes.byref(spec), None, 0)
    if result == -1 and ctypes.get_errno() not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def current_cpu() -> int:
    """The CPU this thread runs on now (glibc's sched_getcpu, ~0.4 us through ctypes), -1
    where unknown."""
    try:
        return _LIBS[2].sched_getcpu()
    except AttributeError:
        return -1


def futex_wake(address: int) -> None:
    """Wake every waiter sleeping on the 32-bit word at ``address``."""
    _LIBS[2].syscall(_SYS_FUTEX, ctypes.c_void_p(address), _FUTEX_WAKE, ctypes.c_int(0x7FFFFFFF), None, None, 0)
