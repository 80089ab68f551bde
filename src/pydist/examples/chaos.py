"""The chaos demo: train.py --fault-tolerant under ``pydist-run --on-failure replace`` while a
random worker is SIGKILLed or SIGSTOPped every --every seconds, for --minutes.

    python -m pydist.examples.chaos [--nproc 4] [--minutes 30] [--every 15] [--freeze-share 0.5]
                             [--epochs 620] [--step-seconds 0.2] [--tcp]

A failure is made only when the world is back to full size. A stopped worker is declared dead
by the others (PYDIST_PEER_TIMEOUT, 3 s by default) and resumed once they went on: it finds it
was evicted and exits, and pydist-run replaces it as it replaces a killed one. Per failure it
prints: the time from the failure to the slowest survivor's first step on the shrunk world,
from the replacement's Python start to the slowest rank's first step on the full world (its
state healed from live peers, no checkpoint read), and the steps redone. At the end: the
distributions, and the held-out accuracy against the same training without failures (run
first, without --step-seconds, which only stands for a heavier model's compute).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

ACCURACY = re.compile(r"held-out accuracy ([0-9.]+) %")


def _command(args, chaos: bool) -> list[str]:
    command = [sys.executable, "-m", "pydist.run", "--nproc-per-node", str(args.nproc)]
    if chaos:
        command += ["--on-failure", "replace", "--max-replacements", "100000"]
    command += ["-m", "pydist.examples.train", "--fault-tolerant", "--epochs", str(args.epochs)]
    return command + (["--report-events", "--step-seconds", str(args.step_seconds)] if chaos else [])


def _environment(args) -> dict[str, str]:
    return {**os.environ, **({"PYDIST_SHM": "0"} if args.tcp else {})}


def baseline_accuracy(args) -> float:
    """The held-out accuracy of the same training without failures."""
    done = subprocess.run(_command(args, chaos=False), capture_output=True, text=True, env=_environment(args))
    found = ACCURACY.findall(done.stdout)
    if done.returncode or not found:
        sys.exit(f"the run without failures failed:\n{done.stderr[-3000:]}")
    return float(found[-1])


class Job:
    """The chaos run: its EVENT lines as a queue, every other line kept (the last ones shown at the end)."""

    def __init__(self, args):
        self.log = open(args.log, "w") if args.log else None  # noqa: SIM115 - open for the job's life
        self.proc = subprocess.Popen(_command(args, chaos=True), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=_environment(args), start_new_session=True)
        self.events: queue.Queue = queue.Queue()
        self.lines: list[str] = []
        self.pids: set[int] = set()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if self.log is not None:
                self.log.write(line)
                self.log.flush()
            if "EVENT " in line:
                event = json.loads(line.split("EVENT ", 1)[1])
                self.pids.add(event["pid"])
                self.events.put(event)
            else:
                self.lines.append(line.rstrip("\n"))
        self.events.put({"event": "ended"})

    def next(self, until: float) -> dict | None:
        try:
            return self.events.get(timeout=max(0.0, until - time.time()))
        except queue.Empty:
            return None


class Chaos:
    """Failures made one at a time, each followed to the full world's first step."""

    def __init__(self, job: Job, size: int, rng: random.Random):
        self.job, self.size, self.rng = job, size, rng
        self.live: dict[int, int] = {}  # pid -> launch rank
        self.ended = False

    def wait_full(self, until: float) -> bool:
        """Until every launch rank said hello (the job's start)."""
        while len(self.live) < self.size:
            event = self.job.next(until)
            if event is None or event["event"] == "ended":
                return False
            if event["event"] == "hello":
                self.live[event["pid"]] = event["launch_rank"]
        return True

    def fail_one(self, freeze: bool, timeout: float) -> dict:
        victim = self.rng.choice(sorted(self.live))
        record = {"kind": "SIGSTOP" if freeze else "SIGKILL", "launch_rank": self.live.pop(victim)}
        failed_at = time.time()
        try:
            os.kill(victim, signal.SIGSTOP if freeze else signal.SIGKILL)
        except ProcessLookupError:  # it exited on its own: a failure of the run, not one made here
            self.ended = True
            return {**record, "back_to_full": False, "steps_redone": 0, "to_shrunk": None, "start_to_full": None,
                    "imports": None, "imported_to_full": None, "exited": True}
        shrunk: dict[int, float] = {}
        full: dict[int, float] = {}
        redone, started, imported, resumed = 0, None, None, False
        until = failed_at + timeout
        while len(full) < self.size:
            event = self.job.next(until)
            if event is None or event["event"] == "ended":
                self.ended = event is not None
                break
            kind, pid = event["event"], event["pid"]
            if kind == "hello":
                self.live[pid] = event["launch_rank"]
                started, imported = event["started"], event["imported"]
            elif kind == "recovered":
                redone = max(redone, event["failed_step"] + 1 - event["step"])
            elif kind == "step" and event["world"] == self.size - 1:  # recovered in a step or in a sync
                shrunk[pid] = event["t"]
                if freeze and not resumed and len(shrunk) == self.size - 1:
                    os.kill(victim, signal.SIGCONT)  # it finds it was declared dead, and leaves
                    resumed = True
            elif kind == "step" and event["world"] == self.size and started is not None:
                full[pid] = event["t"]
        if freeze and not resumed:
            os.kill(victim, signal.SIGCONT)
        record.update(back_to_full=len(full) == self.size, steps_redone=redone,
                      to_shrunk=max(shrunk.values()) - failed_at if len(shrunk) == self.size - 1 else None,
                      start_to_full=max(full.values()) - started if len(full) == self.size and started else None,
                      imports=imported - started if started else None,
                      imported_to_full=max(full.values()) - imported if len(full) == self.size and started else None)
        return record


def _segments() -> set[str]:
    """pydist's shared-memory segments now (Linux)."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {name for name in names if name.startswith("pydist")}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f}"


def _distribution(name: str, values: list[float | None]) -> str:
    ms = sorted(v * 1e3 for v in values if v is not None)
    if not ms:
        return f"{name}: none"
    p90 = ms[round(0.9 * (len(ms) - 1))]
    return (f"{name}, ms: min {ms[0]:.0f}, median {statistics.median(ms):.0f}, p90 {p90:.0f}, "
            f"max {ms[-1]:.0f} ({len(ms)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--minutes", type=float, default=30.0, help="make failures for this long")
    parser.add_argument("--every", type=float, default=15.0, help="seconds between failures")
    parser.add_argument("--freeze-share", type=float, default=0.5, help="the share of failures that are SIGSTOP")
    parser.add_argument("--epochs", type=int, default=620,
                        help="training length: the default outlasts 30 minutes on 4 ranks with the default step")
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--tcp", action="store_true", help="PYDIST_SHM=0: every byte over tcp")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log", help="write the job's whole output to this file")
    parser.add_argument("--failure-timeout", type=float, default=120.0,
                        help="seconds a failure may take to be back to full size before it counts as a hang")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("chaos.py: stopped (SIGTERM)"))  # the job goes too
    print(f"the run without failures ({args.epochs} epochs, {args.nproc} ranks) ...", flush=True)
    baseline = baseline_accuracy(args)
    print(f"  held-out accuracy {baseline:.1f} %", flush=True)
    rng = random.Random(args.seed)
    segments_before = _segments()
    job, records = Job(args), []
    chaos = Chaos(job, args.nproc, rng)
    print(f"{'#':>4} {'at s':>6} {'failure':8} {'rank':>4} {'-> shrunk ms':>12} {'start -> full ms':>16} "
          f"{'imports ms':>10} {'redone':>6}", flush=True)
    try:
        if not chaos.wait_full(time.time() + 180):
            sys.exit("the job did not start:\n" + "\n".join(job.lines[-20:]))
        began = time.time()
        while time.time() - began < args.minutes * 60 and not chaos.ended:
            time.sleep(max(0.0, began + (len(records) + 1) * args.every - time.time()))
            record = chaos.fail_one(rng.random() < args.freeze_share, args.failure_timeout)
            records.append(record)
            print(f"{len(records):4d} {time.time() - began:6.0f} {record['kind']:8} {record['launch_rank']:4d} "
                  f"{_ms(record['to_shrunk']):>12} {_ms(record['start_to_full']):>16} "
                  f"{_ms(record['imports']):>10} {record['steps_redone']:6d}",
                  flush=True)
            if record.get("exited"):
                print(f"launch rank {record['launch_rank']} exited on its own before this failure (see the log)",
                      flush=True)
                break
            if not record["back_to_full"]:
                print("the world did not come back to full size", flush=True)
                break
        job.proc.wait()
    finally:
        if job.proc.poll() is None:
            os.killpg(job.proc.pid, signal.SIGTERM)
            job.proc.wait()
    found = ACCURACY.findall("\n".join(job.lines))
    final = float(found[-1]) if found else None
    full = sum(r["back_to_full"] for r in records)
    print(f"\n{len(records)} failures ({sum(r['kind'] == 'SIGKILL' for r in records)} SIGKILL, "
          f"{sum(r['kind'] == 'SIGSTOP' for r in records)} SIGSTOP) in {args.minutes:g} min, {args.nproc} ranks, "
          f"{'tcp' if args.tcp else 'shm'}: back to full size after {full}; the job exited {job.proc.returncode}")
    for key, name in (("to_shrunk", "failure -> every survivor's first step on the shrunk world"),
                      ("start_to_full", "replacement's start -> every rank's first step on the full world"),
                      ("imports", "replacement's start -> its imports done (torch, sklearn, pydist)"),
                      ("imported_to_full", "replacement's imports done -> every rank's first step on the full world")):
        print(_distribution(name, [r[key] for r in records]))
    print(f"steps redone per failure: {statistics.mean([r['steps_redone'] for r in records] or [0]):.2f} on average")
    print(f"held-out accuracy: {final} % with failures, {baseline:.1f} % without")
    print("log tail:\n  " + "\n  ".join(job.lines[-8:]))
    time.sleep(1.0)  # the launcher's last cleanup
    left = [pid for pid in job.pids if os.path.exists(f"/proc/{pid}")]
    print(f"worker processes left running: {len(left)}; /dev/shm segments left: {len(_segments() - segments_before)}")


if __name__ == "__main__":
    main()
