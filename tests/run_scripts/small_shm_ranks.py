"""Ranks that make groups and all_reduce on each, for a run in a small /dev/shm
(tests/test_adversarial_shm_full.py runs it in a private mount namespace; issue 46's
acceptance: ``python tests/run_scripts/small_shm_ranks.py 8 16 16 torch`` in a /dev/shm of
64 MiB).

Usage: ``small_shm_ranks.py RANKS GROUPS MIB INIT``: RANKS process-ranks (INIT "pydist":
pydist's own API on numpy, "torch": torch.distributed on the pydist backend) make GROUPS
new groups (every other one of all ranks, the others of the even or the odd ranks), then
all_reduce MIB MiB of float32 on the world and on every group they belong to, and check
each result against the sum computed locally. Prints ``right results: N of M all_reduces``
(all ranks together) and exits 0 when all are right, 1 otherwise.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: for the ranks


def members_of(group: int, size: int) -> list[int]:
    if group % 2 == 0 or size < 4:
        return list(range(size))
    return [r for r in range(size) if r % 2 == (group // 2) % 2]


def rank_body(rank: int, size: int, groups: int, mib: int, init: str) -> tuple[int, int]:
    """(right results, all_reduces run) on this rank."""
    import numpy as np
    count = (mib << 20) // 4
    if init == "torch":
        import torch
        import torch.distributed as api
    else:
        import pydist as api  # type: ignore[no-redef]
    made = [(api.new_group(members_of(g, size)), members_of(g, size)) for g in range(groups)]
    right = runs = 0
    for group, members in [(None, list(range(size)))] + made:
        if rank not in members:
            continue
        values = np.arange(count, dtype=np.float32) % 1000 + rank
        expected = (np.arange(count, dtype=np.float32) % 1000) * len(members) + sum(members)
        data = torch.from_numpy(values) if init == "torch" else values
        api.all_reduce(data, group=group)
        result = data.numpy() if init == "torch" else data
        right += bool(np.array_equal(result, expected))
        runs += 1
    return right, runs


def main() -> int:
    ranks, groups, mib, init = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    from pydist.testing import run_processes
    from run_scripts.small_shm_ranks import rank_body as body  # by module name, for the forkserver
    results = run_processes(ranks, body, groups, mib, init, init="torch" if init == "torch" else "env",
                            timeout=600, pg_timeout=120)
    right, runs = sum(r for r, _ in results), sum(n for _, n in results)
    print(f"right results: {right} of {runs} all_reduces", flush=True)
    return 0 if right == runs else 1


if __name__ == "__main__":
    sys.exit(main())
