"""Recovery after a SIGKILL, many trials: the time from the kill to each survivor's first
all_reduce done on the shrunk group (issue 16's target: within 1 s, no hang, no wrong result).

Run: python tools/shrink_trials.py [--size 4] [--trials 100] [--tcp] [--victims random|0|2,3]
Each trial starts SIZE ranks (env://) that all_reduce in a loop, kills the victim(s) after a
random 0.2-1.0 s, and checks every survivor's new group and result
(tests/run_scripts/shrink_ranks.py).
"""
import argparse
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "run_scripts"))
import shrink_ranks  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=4)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--tcp", action="store_true", help="PYDIST_SHM=0: every byte over tcp")
    parser.add_argument("--victims", default="random", help="random, or a comma list of ranks")
    args = parser.parse_args()
    rng = random.Random(16)
    times, failures = [], []
    for trial in range(args.trials):
        victims = ([rng.randrange(args.size)] if args.victims == "random"
                   else [int(v) for v in args.victims.split(",")])
        result = shrink_ranks.shrink_trial(args.size, victims, rng.uniform(0.2, 1.0),
                                           env={"PYDIST_SHM": "0"} if args.tcp else {})
        failures += [f"trial {trial} (victims {victims}): {p}" for p in shrink_ranks.problems(result)]
        times += shrink_ranks.recovery_seconds(result)
    times.sort()
    ms = [round(t * 1000, 1) for t in times]
    print(f"{args.trials} trials, {args.size} ranks, {'tcp' if args.tcp else 'shm'}: {len(times)} survivors "
          f"recovered, {len(failures)} problems")
    if ms:
        print(f"kill -> all_reduce done on the shrunk group, ms: min {ms[0]}, median {statistics.median(ms)}, "
              f"p90 {ms[int(0.9 * (len(ms) - 1))]}, p99 {ms[int(0.99 * (len(ms) - 1))]}, max {ms[-1]}")
        buckets = [10, 25, 50, 100, 250, 500, 1000, float("inf")]
        print("histogram: " + ", ".join(
            f"<={b:g} ms: {sum(1 for t in ms if t <= b and (i == 0 or t > buckets[i - 1]))}"
            for i, b in enumerate(buckets)))
    for failure in failures:
        print("  " + failure[:400])


if __name__ == "__main__":
    main()
