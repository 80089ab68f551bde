"""Issue 46's attack 3, re-run: a flood of idle or one-byte connections against a running
``pydist-run`` job's stores (the launcher's process) and its ranks' listeners, from another
process, while the job starts and runs.

    python tools/admission_flood.py [--kind onebyte|idle] [--seconds 40] [--nofile 1024:1024]
                                    [--target store|rank|both] [--no-flood]

The job: 2 ranks on this host over TCP only (PYDIST_SHM=0, lazy connections, so each rank's
listener stays open), default pydist-run (a per-job secret: both stores require it); each
rank prints when its init is done, then runs all_reduces for --run seconds. pydist-run runs
under ``prlimit --nofile`` (the issue's ``ulimit -n 1024``; pydist-run raises its soft limit
to the hard one, so 1024:1024 is the cramped case). The flood targets the job's store (the
rendezvous store at --master-port, in the launcher's process), a rank's listener (rank
processes' listening ports found in /proc, what a local user learns from ``ss -ltn``), or
both, for --seconds: it opens connections to them round-robin as fast as it can (each
sending one byte, or nothing), keeps them, closes the ones the job closed (as an attacker
recycling descriptors would), and 10 s after the last one was opened counts how many the
job still holds.

Reported: the seconds from launch to both ranks' init done (startup), the job's exit code,
the flood's connections still held 10 s later, and the warning lines the job printed.
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pydist.testing.procfs import family, listening

SRC = Path(__file__).resolve().parents[1] / "src"
WORKER = """
import os, sys, time
import numpy as np
import pydist
started = float(sys.argv[1])
pydist.init_process_group()
print(f"READY rank {pydist.get_rank()} after {time.time() - started:.2f} s", flush=True)
ends = time.monotonic() + float(sys.argv[2])
going = np.ones(1, dtype=np.float32)
while going[0]:  # every rank stops at the same call: when one has run its time
    going[0] = time.monotonic() < ends
    pydist.all_reduce(going, op=pydist.ReduceOp.MIN)
    time.sleep(0.01)
pydist.destroy_process_group()
"""
WARNING = re.compile(r"dropping client|dropped a connection|refused a connection|accept failed|could not accept|"
                     r"rate limited|Too many open files")


class Flood:
    """Connections to ``ports`` (a callable giving the current ones, looked up once a second)
    for ``seconds``."""

    def __init__(self, ports, seconds: float, one_byte: bool):
        self.ports, self.one_byte = ports, one_byte
        self.ends = time.monotonic() + seconds
        self.held: list[socket.socket] = []
        self.opened = 0
        self.last_opened = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        ports: list[int] = []
        looked = 0.0
        while time.monotonic() < self.ends:
            if time.monotonic() - looked > 1.0 or not ports:
                ports, looked = sorted(self.ports()), time.monotonic()
                if not ports:
                    time.sleep(0.01)
                    continue
            for port in ports:
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=1)
                    if self.one_byte:
                        sock.send(b"P")
                except OSError:
                    self._recycle()
                    continue
                self.held.append(sock)
                self.opened += 1
                self.last_opened = time.monotonic()
            if len(self.held) > 2000:
                self._recycle()

    def _recycle(self) -> None:
        """Close the connections the job closed."""
        poll = select.poll()
        by_fd = {sock.fileno(): sock for sock in self.held}
        for fd in by_fd:
            poll.register(fd, select.POLLIN)
        for fd, _ in poll.poll(0):
            sock = by_fd.pop(fd)
            try:
                gone = sock.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                gone = True
            if gone:
                sock.close()
            else:
                by_fd[fd] = sock
        self.held = list(by_fd.values())

    def still_held(self) -> int:
        self._recycle()
        return len(self.held)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kind", choices=["onebyte", "idle"], default="onebyte")
    parser.add_argument("--seconds", type=float, default=40.0, help="how long the flood lasts")
    parser.add_argument("--nofile", default="1024:1024", help="pydist-run's RLIMIT_NOFILE, soft:hard")
    parser.add_argument("--target", choices=["store", "rank", "both"], default="both")
    parser.add_argument("--run", type=float, default=60.0, help="seconds the ranks run all_reduces after init")
    parser.add_argument("--no-flood", action="store_true")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "worker.py"
        script.write_text(WORKER)
        env = {**os.environ, "PYTHONPATH": str(SRC), "PYDIST_SHM": "0", "PYDIST_TCP_CONNECT": "lazy"}
        env.pop("PYDIST_AUTH_TOKEN", None)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            master_port = probe.getsockname()[1]
        started = time.time()
        job = subprocess.Popen(["prlimit", f"--nofile={args.nofile}", sys.executable, "-m", "pydist.run",
                                "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
                                str(master_port), str(script), str(started), str(args.run)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        output: list[str] = []
        reader = threading.Thread(target=lambda: output.extend(job.stdout), daemon=True)
        reader.start()
        launcher = job.pid

        def ports() -> set[int]:
            found = {master_port} if args.target in ("store", "both") else set()
            ranks = sorted(family(launcher) - {launcher}) if job.poll() is None else []
            if args.target in ("rank", "both") and ranks:
                found |= {port for _, port in listening({ranks[-1]})}  # one rank's (a worker: no child of its own)
            return found

        if not args.no_flood:
            flood = Flood(ports, args.seconds, args.kind == "onebyte")
            flood.thread.join(args.seconds + 5)
            time.sleep(max(0.0, flood.last_opened + 10 - time.monotonic()))
            alive = job.poll() is None
            held = flood.still_held()
            print(f"flood: {args.kind}, {flood.opened} connections opened to {args.target} "
                  f"in {args.seconds:g} s; still held 10 s after the last "
                  f"was opened: {held} ({100 * held / max(flood.opened, 1):.2f} %)"
                  f"{'' if alive else ' (the job had exited: measure again with a longer --run)'}")
            flood.ends = 0
        try:
            code: int | str = job.wait(timeout=args.run + 120)
        except subprocess.TimeoutExpired:
            job.terminate()  # prlimit exec'd pydist-run: the launcher, which stops its workers
            try:
                job.wait(30)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait()
            code = f"none: killed, not finished {args.run + 120:g} s after the flood"
        reader.join(10)
        ready = [float(m.group(1)) for line in output for m in [re.search(r"READY rank \d+ after ([\d.]+) s", line)]
                 if m]
        print(f"job exit code {code}; startup (launch to both ranks' init done): "
              f"{max(ready) if len(ready) == 2 else 'not reached'} s")
        if code:
            print("".join(line for line in output if not WARNING.search(line))[-6000:])
        warnings = [line.rstrip() for line in output if WARNING.search(line)]
        print(f"warning lines printed by the job: {len(warnings)}")
        for line in warnings[:30]:
            print("   ", line[:200])
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


if __name__ == "__main__":
    main()
