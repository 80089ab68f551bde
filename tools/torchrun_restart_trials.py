"""torchrun restart trials: how many runs of ``torchrun --max-restarts 1`` (attempt 0's last
rank exits, attempt 1 should finish) succeed, per backend, rendezvous and world size.

Run: python tools/torchrun_restart_trials.py [--trials 20] [--backends pydist,gloo]
     [--rdzv static,c10d] [--nproc 2,4] [--late 1.0] [--cap 150]
Prints one row per combination: successes, failures, runs killed at the cap, the longest run.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from torchrun_support import torchrun_restart  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--backends", default="pydist,gloo")
    parser.add_argument("--rdzv", default="static,c10d")
    parser.add_argument("--nproc", default="2,4")
    parser.add_argument("--late", type=float, default=1.0, help="attempt 1's rank 0 starts this late (s)")
    parser.add_argument("--cap", type=float, default=150.0, help="a run still going then is killed (s)")
    args = parser.parse_args()
    print("| backend | rendezvous | ranks | succeeded | failed | killed at the cap | longest run (s) |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for nproc in map(int, args.nproc.split(",")):
        for rdzv in args.rdzv.split(","):
            for backend in args.backends.split(","):
                runs = [torchrun_restart(backend, nproc, rdzv, args.late, args.cap) for _ in range(args.trials)]
                ok = sum(run.succeeded for run in runs)
                killed = sum(run.returncode is None for run in runs)
                print(f"| {backend} | {rdzv} | {nproc} | {ok}/{len(runs)} | {len(runs) - ok - killed} | {killed} | "
                      f"{max(run.seconds for run in runs):.1f} |", flush=True)
                for run in runs:
                    if not run.succeeded and os.environ.get("TRIALS_VERBOSE"):
                        print(run.output[-1500:], file=sys.stderr)


if __name__ == "__main__":
    main()
