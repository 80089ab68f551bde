"""torchrun with one restart, as the restart tests and tools/torchrun_restart_trials.py run it.

``torchrun_restart(backend, nproc, rdzv)`` runs tests/run_scripts/torchrun_restart.py under
``torchrun --max-restarts 1`` (attempt 0's last rank exits, attempt 1 should run to the end)
with the static rendezvous (``--master-port``) or the c10d one (``--rdzv-backend c10d``),
on a free port, and says whether every rank of attempt 1 printed the right result.
"""
from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from pydist.testing.commands import CommandTimeout, finish, start_command
from pydist.testing.processes import free_port

SCRIPT = Path(__file__).resolve().parent / "run_scripts" / "torchrun_restart.py"
GROW_SCRIPT = SCRIPT.with_name("torchrun_grow.py")
RDZV = ("static", "c10d")


@dataclass
class Attempt:
    """One torchrun run: its exit code (None: killed at the cap), whether attempt 1's results
    were all right, its seconds, and its output."""
    returncode: int | None
    right: bool
    seconds: float
    output: str

    @property
    def succeeded(self) -> bool:
        return self.returncode == 0 and self.right


def torchrun_command(backend: str, nproc: int, rdzv: str, late: float, script: Path = SCRIPT) -> list[str]:
    """The torchrun command line of one run (see the module)."""
    if rdzv not in RDZV:
        raise ValueError(f"rdzv: expected one of {', '.join(RDZV)}, got {rdzv!r}")
    port = free_port()
    where = (["--master-addr", "127.0.0.1", "--master-port", str(port)] if rdzv == "static" else
             ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"restart-{port}"])
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
            "--max-restarts", "1", "--monitor-interval", "0.1", *where, str(script), backend, str(late)]


def torchrun_restart(backend: str, nproc: int, rdzv: str, late: float = 1.0, cap: float = 150.0) -> Attempt:
    """Run it once (killed after ``cap`` seconds); see the module."""
    began = time.monotonic()
    proc = start_command(torchrun_command(backend, nproc, rdzv, late), env=dict(os.environ))
    try:
        done, = finish([proc], timeout=cap)
        out, err, code = done.stdout, done.stderr, done.returncode
    except CommandTimeout as timeout:
        out, err, code = "", str(timeout), None
    total = float(sum(range(1, nproc + 1)))
    return Attempt(code, results(out) == {(r, 1, (total,) * 4) for r in range(nproc)}, time.monotonic() - began,
                   out + err)


def results(output: str) -> set[tuple[int, int, tuple[float, ...]]]:
    """Each ``RESULT rank attempt [sum]`` printed, as (rank, attempt, sum). Searched, not read by
    line: torchrun passes its workers' output on unprefixed, two ranks' lines may run together."""
    return {(int(rank), int(attempt), tuple(float(x) for x in values.split(",")))
            for rank, attempt, values in re.findall(r"RESULT (\d+) (\d+) \[([^\]]*)\]", output)}
