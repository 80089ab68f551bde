"""A rank SIGKILLed in every communication pattern (tree, ring, pairwise, point-to-point), over
tcp (shared memory off, or 4 ranks posing as 4 hosts; the caller reading the sockets while it
waits, or only the I/O thread), shared memory, and the hierarchical and rails algorithms of 2
hosts x 2 ranks (a host's leader, its peer, a rail; 1 MiB segments, so between segments too), with buffers up to
16 MiB (broadcasts: always 16 MiB, so the root runs ahead): every survivor raises a
DistNetworkError naming the dead rank, well before the group timeout (detected, not timed
out; how fast is the soak's to check), and destroy_process_group then returns (the harness:
tests/run_scripts/robust_ranks.py)."""
from __future__ import annotations

import pytest
from run_scripts import robust_ranks

pytestmark = pytest.mark.slow  # 4 real processes moving megabytes, several trials each

TCP = {"PYDIST_SHM": "0"}
FOUR_HOSTS = {"PYDIST_HOST_ID": "host{rank}"}
TWO_BY_TWO = {"PYDIST_HOST_ID": "host{rank//2}", "PYDIST_SEGMENT_BYTES": str(1 << 20)}  # ranks 0-1, 2-3 share a host
HIERARCHICAL = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")
SHM: dict[str, str] = {}
BIG = 16 << 20
#: The kill comes a random 0..KILL_WITHIN_S s after every rank is in its loop. A 16 MiB
#: collective with its inputs made takes ~10-30 ms here, so the kill still lands anywhere in
#: dozens of them (it was 1.5 s: ~20 s more in all, the ranks spinning meanwhile).
KILL_WITHIN_S = 0.75

#: (name, kinds, victim, fixed broadcast root, environment)
PATTERNS = [
    ("broadcast root, tcp", ("broadcast",), 0, 0, TCP),
    ("broadcast root, 4 hosts", ("broadcast",), 0, 0, FOUR_HOSTS),
    ("broadcast root, shm", ("broadcast",), 0, 0, SHM),
    ("broadcast inner node, tcp", ("broadcast",), 2, 0, TCP),
    ("broadcast leaf, tcp", ("broadcast",), 3, 0, TCP),
    ("all_reduce ring, tcp", ("all_reduce",), 2, None, TCP),
    ("all_reduce ring, tcp, I/O thread reads", ("all_reduce",), 2, None, {**TCP, "PYDIST_TCP_READER": "io"}),
    ("broadcast root, tcp, I/O thread reads", ("broadcast",), 0, 0, {**TCP, "PYDIST_TCP_READER": "io"}),
    ("all_gather and reduce_scatter rings, tcp", ("all_gather", "reduce_scatter"), 1, None, TCP),
    ("all_to_all and p2p, tcp", ("all_to_all", "sendrecv"), 3, None, TCP),
    ("every kind, 4 hosts", robust_ranks.KINDS, 1, None, FOUR_HOSTS),
    ("hierarchical, 2 hosts x 2: a host's leader (network stage)", HIERARCHICAL, 2, None, TWO_BY_TWO),
    ("hierarchical, 2 hosts x 2: a leader's host peer (shared-memory stage)", HIERARCHICAL, 1, None, TWO_BY_TWO),
    ("hierarchical broadcast, 2 hosts x 2: the root", ("broadcast",), 0, 0, TWO_BY_TWO),
    ("every kind, 4 hosts, connections on first use", robust_ranks.KINDS, 1, None,
     {**FOUR_HOSTS, "PYDIST_TCP_CONNECT": "lazy"}),
    ("broadcast root, tcp, connections on first use", ("broadcast",), 0, 0, {**TCP, "PYDIST_TCP_CONNECT": "lazy"}),
    ("hierarchical, 2 hosts x 2, connections on first use", HIERARCHICAL, 2, None,
     {**TWO_BY_TWO, "PYDIST_TCP_CONNECT": "lazy"}),
    ("rails, 2 hosts x 2: a rank carrying a slice", HIERARCHICAL, 3, None,
     {**TWO_BY_TWO, "PYDIST_ALGO_ALL_REDUCE": "rails", "PYDIST_ALGO_BROADCAST": "rails"}),
]


@pytest.mark.parametrize("name, kinds, victim, root, env", PATTERNS, ids=[p[0] for p in PATTERNS])
def test_every_survivor_names_the_dead_rank_before_the_timeout(name, kinds, victim, root, env):
    results = [robust_ranks.kill_trial(trial, kinds=kinds, victim=victim, root=root, env=env, max_bytes=BIG,
                                       min_bytes=BIG if root is not None else 1, max_delay_s=KILL_WITHIN_S)
               for trial in range(3)]
    problems = [f"trial {r['trial']} (kill after {r['delay_s']:.2f} s): {p}"
                for r in results for p in robust_ranks.violations(r)]
    assert not problems, f"{name}:\n" + "\n".join(problems)
