"""Where workers' output and error records go: torchrun's --log-dir, -r/--redirects,
-t/--tee and --local-ranks-filter.

A stream spec is ``0`` (nothing), ``1`` (stdout), ``2`` (stderr) or ``3`` (both), for
every local rank, or per local rank as ``0:1,1:3`` (ranks not named: 0). A redirected
stream goes only to ``<attempt dir>/<local rank>/stdout.log`` / ``stderr.log``; a tee'd
one goes there and to the console. ``--local-ranks-filter 0,2`` shows only those local
ranks on the console. Attempt directories are ``<log dir>/<run id>/attempt_<N>/``; each
worker's uncaught exception is recorded in ``<attempt dir>/<local rank>/error.json``.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field

STDOUT, STDERR = 1, 2


def parse_streams(text: str) -> dict[int, int] | int:
    """A stream spec: an int 0..3 for every rank, or {local rank: 0..3}. ValueError if bad."""
    def level(value: str) -> int:
        if value.strip() not in ("0", "1", "2", "3"):
            raise ValueError(f"stream spec {text!r}: expected 0, 1, 2 or 3, got {value!r}")
        return int(value)

    if ":" not in text:
        return level(text)
    spec: dict[int, int] = {}
    for part in text.split(","):
        rank, _, value = part.partition(":")
        if not rank.strip().isdigit():
            raise ValueError(f"stream spec {text!r}: expected LOCAL_RANK:0..3 pairs, got {part!r}")
        spec[int(rank)] = level(value)
    return spec


def parse_ranks_filter(text: str) -> frozenset[int] | None:
    """``--local-ranks-filter``: comma-separated local ranks; empty: no filter."""
    if not text:
        return None
    try:
        return frozenset(int(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--local-ranks-filter: expected comma-separated local ranks, got {text!r}") from None


@dataclass(frozen=True)
class LogSpec:
    """The launcher's log flags."""

    log_dir: str | None = None
    redirects: dict[int, int] | int = 0
    tee: dict[int, int] | int = 0
    local_ranks_filter: frozenset[int] | None = None

    @staticmethod
    def _has(spec: dict[int, int] | int, local_rank: int, stream: int) -> bool:
        value = spec if isinstance(spec, int) else spec.get(local_rank, 0)
        return bool(value & stream)

    def to_file(self, local_rank: int, stream: int) -> bool:
        return self._has(self.redirects, local_rank, stream) or self._has(self.tee, local_rank, stream)

    def to_console(self, local_rank: int, stream: int) -> bool:
        if self.local_ranks_filter is not None and local_rank not in self.local_ranks_filter:
            return False
        return not self._has(self.redirects, local_rank, stream) or self._has(self.tee, local_rank, stream)


@dataclass
class LogDirs:
    """The job's log directory on this node: the user's --log-dir (kept), or a temporary
    one removed by :meth:`close`."""

    spec: LogSpec
    run_id: str
    root: str = field(init=False)

    def __post_init__(self) -> None:
        if self.spec.log_dir:
            self.root = os.path.join(self.spec.log_dir, self.run_id)
            self._temporary = False
        else:
            self.root = tempfile.mkdtemp(prefix="pydist-run-")
            self._temporary = True

    def worker_dir(self, attempt: int, local_rank: int) -> str:
        path = os.path.join(self.root, f"attempt_{attempt}", str(local_rank))
        os.makedirs(path, exist_ok=True)
        return path

    def close(self) -> None:
        if self._temporary:
            shutil.rmtree(self.root, ignore_errors=True)
