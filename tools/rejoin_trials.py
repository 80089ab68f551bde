"""Kill-and-rejoin trials: one job under pydist-run --on-failure replace, a random worker killed
(SIGKILL, or with --freeze stopped with SIGSTOP and resumed once the others went on) each time
the world is back to full size; per trial the time from the failure to the survivors' first
step on the shrunk world (the slowest survivor's), and from the replacement's Python start to
the first step of every rank on the full world, its STATE_MB healed (tools/rejoin_worker.py).

Run: python tools/rejoin_trials.py [--size 4] [--trials 100] [--tcp] [--freeze] [--state-mb 100]
Counts hangs (a trial not done within --trial-timeout), wrong results, and, at the end, worker
processes left running and /dev/shm segments left behind.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import random
import signal
import statistics
import subprocess
import sys
import threading
import time

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rejoin_worker.py")


class Job:
    """The launched job and the JSON events its workers print."""

    def __init__(self, size: int, state_mb: float, step: float, trials: int, env: dict[str, str]):
        command = [sys.executable, "-m", "pydist.run", "--nproc-per-node", str(size), "--on-failure", "replace",
                   "--max-replacements", str(trials + 10), WORKER, str(state_mb), str(step)]
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **env}, start_new_session=True)
        self.events: queue.Queue = queue.Queue()
        self.pids: set[int] = set()
        self.log: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()
        threading.Thread(target=self._keep, args=(self.proc.stderr,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            text = line.split(":", 1)[1] if line.startswith("[rank") else line
            try:
                event = json.loads(text)
            except ValueError:
                self.log.append(line)
                continue
            if event.get("event") == "hello":
                self.pids.add(event["pid"])
            self.events.put(event)

    def _keep(self, stream) -> None:
        for line in stream:
            self.log.append(line)

    def next(self, until: float) -> dict | None:
        try:
            return self.events.get(timeout=max(0.0, until - time.time()))
        except queue.Empty:
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def trial(job: Job, live: dict[int, dict], size: int, freeze: bool, rng: random.Random,
          timeout: float) -> dict:
    """One failure and its recovery; the times, or why the trial failed."""
    victim = rng.choice(sorted(live))
    failed_at = time.time()
    try:
        os.kill(victim, signal.SIGSTOP if freeze else signal.SIGKILL)
    except ProcessLookupError:
        raise SystemExit(f"worker {live[victim]} exited before the trial; the job's last lines:\n"
                         + "".join(job.log[-30:])) from None
    until = failed_at + timeout
    shrunk, full, started, joined, wrong, resumed = {}, {}, None, None, [], False
    while len(full) < size:
        event = job.next(until)
        if event is None:
            return {"hang": True, "victim": live[victim], "shrunk": len(shrunk), "full": len(full),
                    "replacement": started is not None}
        kind, pid = event.get("event"), event["pid"]
        if kind == "wrong":
            wrong.append(event)
        elif kind == "hello" and event["joined"]:
            started, joined = event["started"], event["t"]
            live[pid] = event
        elif kind == "step" and event["world"] == size - 1:  # recovered in a step or in sync()
            shrunk[pid] = event["t"]
            if freeze and not resumed and len(shrunk) == size - 1:
                os.kill(victim, signal.SIGCONT)  # it wakes to find it was declared dead, and leaves
                resumed = True
        elif kind == "step" and event["world"] == size and started is not None:
            full[pid] = event["t"]
    live.pop(victim, None)
    if freeze and not resumed:
        os.kill(victim, signal.SIGCONT)
    return {"hang": False, "victim": live.get(victim), "wrong": wrong,
            "failure_to_shrunk": max(shrunk.values()) - failed_at if len(shrunk) == size - 1 else None,
            "start_to_full": max(full.values()) - started if started is not None else None,
            "start_to_joined": joined - started if started is not None else None}


def _summary(name: str, seconds: list[float]) -> str:
    ms = sorted(round(s * 1000) for s in seconds if s is not None)
    if not ms:
        return f"{name}: none"
    return (f"{name}, ms: min {ms[0]}, median {statistics.median(ms):.0f}, p90 {ms[round(0.9 * (len(ms) - 1))]}, "
            f"max {ms[-1]} ({len(ms)} trials)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=4)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--tcp", action="store_true", help="PYDIST_SHM=0: every byte over tcp")
    parser.add_argument("--freeze", action="store_true", help="SIGSTOP instead of SIGKILL (resumed later)")
    parser.add_argument("--state-mb", type=float, default=100.0)
    parser.add_argument("--step", type=float, default=0.01, help="seconds of 'compute' per step")
    parser.add_argument("--trial-timeout", type=float, default=60.0)
    args = parser.parse_args()
    before = {n for n in os.listdir("/dev/shm") if n.startswith("pydist")}
    job = Job(args.size, args.state_mb, args.step, args.trials, {"PYDIST_SHM": "0"} if args.tcp else {})
    live: dict[int, dict] = {}
    rng = random.Random(31)
    results = []
    try:
        until = time.time() + 120
        while len(live) < args.size:
            event = job.next(until)
            if event is None:
                sys.exit("the job did not start:\n" + "".join(job.log[-20:]))
            if event.get("event") == "hello":
                live[event["pid"]] = event
        time.sleep(1.0)  # every rank in its loop
        for number in range(args.trials):
            result = trial(job, live, args.size, args.freeze, rng, args.trial_timeout)
            results.append(result)
            if result["hang"]:
                print(f"trial {number}: HANG {result}\nthe job's last lines:\n" + "".join(job.log[-30:]), flush=True)
                break
            time.sleep(rng.uniform(0.1, 0.5))
    finally:
        job.stop()
    time.sleep(1.0)
    left = sorted(pid for pid in job.pids if _alive(pid))
    segments = sorted({n for n in os.listdir("/dev/shm") if n.startswith("pydist")} - before)
    done = [r for r in results if not r["hang"]]
    what = "SIGSTOP" if args.freeze else "SIGKILL"
    print(f"{len(results)} trials, {args.size} ranks, {'tcp' if args.tcp else 'shm'}, {what}, "
          f"{args.state_mb:g} MB state: {len(results) - len(done)} hangs, "
          f"{sum(len(r['wrong']) for r in done)} wrong results, {len(left)} processes left, "
          f"{len(segments)} /dev/shm segments left")
    print(_summary("failure -> every survivor's first step on the shrunk world",
                   [r["failure_to_shrunk"] for r in done]))
    print(_summary("replacement's Python start -> every rank's first step on the full world, state healed",
                   [r["start_to_full"] for r in done]))
    print(_summary("  of which: its Python start -> admitted (imports, init_process_group joined)",
                   [r["start_to_joined"] for r in done]))


if __name__ == "__main__":
    main()
