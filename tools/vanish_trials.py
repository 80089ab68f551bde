"""Heartbeat detection times: HOSTS network-namespace hosts, one rank each, all_reduce in a
loop; host HOSTS-1's link goes down (no FIN, no RST); each survivor's time to raise naming
it. Root and iproute2 needed (the netns harness).

Run: python tools/vanish_trials.py [--trials 10] [--hosts 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "src"))
from pydist.testing import free_port  # noqa: E402
from pydist.testing.netns import Network  # noqa: E402

RANK = os.path.join(ROOT, "tests", "run_scripts", "vanish_rank.py")


def trial(hosts: int) -> list[float]:
    with Network(hosts=hosts) as net:
        port = free_port()
        procs = [net.popen(i, [sys.executable, RANK], stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "MASTER_ADDR": net.hosts[0].addr, "MASTER_PORT": str(port),
                                "RANK": str(i), "WORLD_SIZE": str(hosts), "PYTHONPATH": os.path.join(ROOT, "src")})
                 for i in range(hosts)]
        for proc in procs:
            json.loads(proc.stdout.readline())
        time.sleep(0.5)
        gone = time.time()
        net.link_down(hosts - 1)
        times = []
        for proc in procs[:-1]:
            report = json.loads(proc.stdout.readline())
            named = report["dead"] == [hosts - 1] and f"rank {hosts - 1} on" in report["message"]
            times.append(report["raised"] - gone if named else float("nan"))
        return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--hosts", type=int, default=3)
    args = parser.parse_args()
    times = sorted(t for _ in range(args.trials) for t in trial(args.hosts))
    print(f"{args.trials} trials, {args.hosts} hosts, the last one's link set down mid-all_reduce: "
          f"{len(times)} survivor detections, {sum(t != t for t in times)} not naming it")
    print(f"seconds to raise: min {times[0]:.2f}, median {statistics.median(times):.2f}, max {times[-1]:.2f}")


if __name__ == "__main__":
    main()
