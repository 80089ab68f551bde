"""torchrun restart trials: how many runs of ``torchrun --max-restarts 1`` (attempt 0's last
rank exits, attempt 1 should finish) succeed, per backend, rendezvous and world size.

Run: python tools/torchrun_restart_trials.py [--trials 20] [--backends pydist,gloo]
     [--rdzv static,c10d] [--nproc 2,4] [--late 1.0] [--cap 150] [--failures DIR]
Prints one row per combination: successes, failures, runs killed at the cap, the longest run;
one line per run on stderr; each failed run's output in DIR.
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
    parser.add_argument("--failures", default="", help="a folder to write each failed run's output to")
    args = parser.parse_args()
    print("| backend | rendezvous | ranks | succeeded | failed | killed at the cap | longest run (s) |")
    print("|---|---|---|---|---|---|---|", flush=True)
    for nproc in map(int, args.nproc.split(",")):
        for rdzv in args.rdzv.split(","):
            for backend in args.backends.split(","):
                runs = []
                for trial in range(args.trials):
                    runs.append(torchrun_restart(backend, nproc, rdzv, args.late, args.cap))
                    run = runs[-1]
                    print(f"{backend} {rdzv} {nproc} #{trial}: exit {run.returncode}, right {run.right}, "
                          f"{run.seconds:.1f} s", file=sys.stderr, flush=True)
                    if not run.succeeded and args.failures:
                        os.makedirs(args.failures, exist_ok=True)
                        name = f"{backend}-{rdzv}-{nproc}-{trial}.log"
                        with open(os.path.join(args.failures, name), "w") as log:
                            log.write(run.output)
                ok = sum(run.succeeded for run in runs)
                killed = sum(run.returncode is None for run in runs)
                print(f"| {backend} | {rdzv} | {nproc} | {ok}/{len(runs)} | {len(runs) - ok - killed} | {killed} | "
                      f"{max(run.seconds for run in runs):.1f} |", flush=True)


if __name__ == "__main__":
    main()
