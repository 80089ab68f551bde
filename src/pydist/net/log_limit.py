"""A rate limit on one source of warnings, e.g. the connections a listener refuses.

An outsider can open connections faster than anyone can read their warnings. A
:class:`LogLimit` logs the first ``burst`` warnings given to it in full; after those it
counts them and logs at most one summary line per period (on pydist's injectable clock,
:func:`pydist.core.deadline.now`): how many came since the last line, in how long, and the
last one in full. The period is ``interval`` seconds at first and doubles with each summary
while the warnings keep coming (up to ``MAX_INTERVAL``: a flood of an hour leaves about 20
lines), back to ``interval`` after a period without any. A summary is written when a warning
arrives a period or more after the last line, and by :meth:`LogLimit.flush` (the listener's
close) for those still counted, so none is lost without a trace. Thread-safe; it never
raises (the logging module handles its handlers' errors, and a warning whose arguments do
not format is summarised by its format string).
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from ..core import deadline as _deadline

#: warnings logged in full by each limit before it summarises
BURST = 5
#: seconds between two summary lines of one limit, at least
INTERVAL = 10.0
#: seconds between two summary lines of one limit at most (the period stops doubling there)
MAX_INTERVAL = 300.0


class LogLimit:
    """The warnings of one source (``what``: a name for them in the summary, e.g.
    ``"pydist rank 3: connections refused"``) on ``logger``: the first ``burst`` in full,
    then at most one summary per period, ``interval`` seconds at first (see the module)."""

    def __init__(self, logger: logging.Logger, what: str, burst: int = BURST, interval: float = INTERVAL):
        self._logger, self._what, self._burst, self._interval = logger, what, burst, interval
        self._lock = threading.Lock()
        self._logged = 0  # warnings logged in full
        self._held = 0  # warnings counted since the last line
        self._last_line: float | None = None  # clock time of the last line written
        self._held_since = 0.0  # clock time of the first warning counted since
        self._last: tuple[str, tuple[Any, ...]] = ("", ())  # the last warning counted
        self._period = interval  # seconds from the last line to the next summary, at least
        self._last_warning: float | None = None  # clock time of the last warning given

    def warning(self, msg: str, *args: Any, exc_info: bool = False) -> None:
        """Log ``msg % args`` at WARNING (``exc_info``: with the exception being handled), or
        count it (and maybe summarise; see the class)."""
        now, summary = _deadline.now(), None
        with self._lock:
            quiet = self._last_warning is not None and now - self._last_warning >= self._period
            if quiet:
                self._period = self._interval  # a new episode: its summaries come sooner again
            self._last_warning = now
            full = self._logged < self._burst
            if full:
                self._logged += 1
                self._last_line = now
            else:
                if not self._held:
                    self._held_since = now
                self._held += 1
                self._last = (msg, args)
                if self._last_line is None or now - self._last_line >= self._period:
                    summary = self._take(now)
                    if not quiet:
                        self._period = min(2 * self._period, max(MAX_INTERVAL, self._interval))
        if full:
            self._logger.warning(msg, *args, exc_info=exc_info)
        elif summary is not None:
            self._logger.warning("%s", summary)

    def flush(self) -> None:
        """Log a summary of the warnings counted since the last line, if any."""
        with self._lock:
            summary = self._take(_deadline.now())
        if summary is not None:
            self._logger.warning("%s", summary)

    def _take(self, now: float) -> str | None:
        """The summary of the counted warnings (None: none), which it resets, as the line
        written at ``now``; lock held."""
        if not self._held:
            return None
        msg, args = self._last
        try:
            last = msg % args if args else msg
        except (TypeError, ValueError):
            last = msg
        held, seconds = self._held, now - self._held_since
        self._held, self._last_line = 0, now
        return f"{self._what}: {held} more in the last {seconds:.0f} s (rate limited), the last: {last}"
