"""Why this process is ending: what a rank tells its peers when it exits without
destroy_process_group (see groups.farewell), so that a crash reads as a crash there.

``watch()`` (idempotent; every world that joins calls it) chains, keeping the hooks it finds:

- ``sys.excepthook``: an uncaught exception of the main thread ("ValueError: bad input");
- ``threading.excepthook``: one of another thread ("... (in thread 'loader')");
- ``sys.exit``: a failing status ("sys.exit(3)"), after the exception being handled if any
  ("ValueError: bad input, then sys.exit(1)": what torch.multiprocessing.spawn's children do).

``cause()`` is the first of these recorded (None: none seen), at most MAX_CAUSE characters.
Not seen: ``raise SystemExit(n)`` (no hook runs for it, and the interpreter clears it
before the exit handlers run, keeping the status in C only: such a rank reads as one that
exited without destroy_process_group; docs/guide/fault-tolerance.md, "What cannot be told")
and a signal's default action (the process dies before any hook: its peers see the
connection drop, which reads as a failure).
"""
from __future__ import annotations

import sys
import threading
from types import TracebackType
from typing import Any, NoReturn

#: the longest cause kept (a goodbye frame carries it; the rest of a long message is cut)
MAX_CAUSE = 400

_lock = threading.Lock()
_cause: str | None = None
_watching = False


def watch() -> None:
    """Start recording the first failure that ends this process (once per process)."""
    global _watching
    with _lock:
        if _watching:
            return
        _watching = True
    previous_hook, previous_thread_hook, previous_exit = sys.excepthook, threading.excepthook, sys.exit

    def excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        record(describe(value))
        previous_hook(kind, value, tb)

    def thread_excepthook(args: Any) -> None:
        if args.exc_value is not None and not isinstance(args.exc_value, SystemExit):
            name = args.thread.name if args.thread is not None else "?"
            record(f"{describe(args.exc_value)} (in thread {name!r})")
        previous_thread_hook(args)

    def exit(status: str | int | None = None) -> NoReturn:  # noqa: A001 - replaces sys.exit
        if status not in (None, 0):
            handled = sys.exc_info()[1]
            record(f"{describe(handled)}, then sys.exit({status!r})" if handled is not None
                   else f"sys.exit({status!r})")
        previous_exit(status)

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
    sys.exit = exit


def describe(error: BaseException) -> str:
    """``Type: message`` of ``error`` (just the type when the message is empty)."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def record(text: str) -> None:
    """Keep ``text`` as the cause unless one was recorded before (the first failure is the cause)."""
    global _cause
    with _lock:
        if _cause is None:
            _cause = text if len(text) <= MAX_CAUSE else text[:MAX_CAUSE - 3] + "..."


def cause() -> str | None:
    """The failure recorded (see the module's docstring); None when none was seen."""
    return _cause
