"""Which algorithm the native engine runs for a call: a pure policy of the group's shape.

Choice (docs/algorithms.md has the costs; ``PYDIST_ALGO_<COLLECTIVE>=<name>`` forces one,
e.g. ``PYDIST_ALGO_ALL_REDUCE=ring``):

- every rank of the group on this host, with shared memory: the ``shm`` algorithm of each
  collective (through the group's arena);
- ranks on several hosts, some host with more than one of them, shared memory on:
  ``hierarchical`` all_reduce, broadcast, reduce, all_gather and reduce_scatter (shared
  memory inside hosts, the network among one leader per host); otherwise, and for the
  other collectives, the network algorithms below, whose same-host pairs still go through
  shared-memory rings;
- network algorithms: all_reduce ``recursive_doubling`` up to SMALL_ALL_REDUCE_BYTES (or
  fewer elements than ranks) and the segmented ``ring`` above (``network_all_reduce``, also
  the choice among the hosts' leaders in ``hierarchical``); ``binomial`` trees for
  broadcast and reduce; all_gather ``bruck`` up to SMALL_ALL_GATHER_BYTES of output and
  reduce_scatter ``recursive_doubling`` (an all_reduce of the whole input) up to
  SMALL_ALL_REDUCE_BYTES of input, among more than two ranks, the ``ring`` above
  (``network_by_size``, also among the hosts' leaders); ``pairwise`` all_to_all;
  ``linear`` gather and scatter; ``dissemination`` barrier.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ..algorithms import (
    allgather_bruck,
    allgather_hierarchical,
    allgather_ring,
    allgather_shm,
    allreduce_hierarchical,
    allreduce_rails,
    allreduce_recursive_doubling,
    allreduce_ring,
    allreduce_shm,
    alltoall_pairwise,
    alltoall_shm,
    barrier_dissemination,
    barrier_shm,
    broadcast_binomial,
    broadcast_hierarchical,
    broadcast_rails,
    broadcast_shm,
    gather_linear,
    gather_shm,
    reduce_binomial,
    reduce_hierarchical,
    reduce_scatter_hierarchical,
    reduce_scatter_recursive_doubling,
    reduce_scatter_ring,
    reduce_scatter_shm,
    reduce_shm,
    scatter_linear,
    scatter_shm,
)

#: all_reduce among network peers: recursive doubling (log2(p) rounds, the whole buffer each)
#: up to this size, the pipelined ring (2(p-1) rounds of 1/p of it) above. Recursive doubling
#: wins while rounds cost latency, the ring once bytes dominate (it sends 2(p-1)/p buffers per
#: rank, not log2(p)). Measured with pydist-bench, 4 ranks, PYDIST_SHM=0 (loopback TCP), 2 busy
#: cores, each algorithm forced: recursive doubling was faster up to 1 MiB (512 KiB: 2.5-3.6 ms
#: vs 5.3-8.7 ms), about even at 2 MiB, the ring faster from 4 MiB (12-19 ms vs 24-26 ms). So
#: 64 KiB is conservative on loopback; it stays until the cross-host engine measures real links
#: (veth, 1 Gbit/s), where the ring's smaller byte count matters sooner.
SMALL_ALL_REDUCE_BYTES = 64 * 1024

#: all_gather among network peers: Bruck (log2(p) rounds) up to this much output per rank,
#: the ring (p-1 rounds, pipelined by segment) above. Both send (p-1)/p of the output; Bruck
#: wins while rounds cost latency (many ranks or hosts, small blocks), the ring once segment
#: pipelining over the neighbour link matters. See docs/algorithms.md for the measurement.
SMALL_ALL_GATHER_BYTES = 64 * 1024

#: per collective, its algorithms by name (their signatures differ by collective)
ALGORITHMS: dict[str, dict[str, Callable[..., None]]] = {
    "all_reduce": {"shm": allreduce_shm.all_reduce, "hierarchical": allreduce_hierarchical.all_reduce,
                   "rails": allreduce_rails.all_reduce, "recursive_doubling": allreduce_recursive_doubling.all_reduce,
                   "ring": allreduce_ring.all_reduce},
    "broadcast": {"shm": broadcast_shm.broadcast, "hierarchical": broadcast_hierarchical.broadcast,
                  "rails": broadcast_rails.broadcast, "binomial": broadcast_binomial.broadcast},
    "reduce": {"shm": reduce_shm.reduce, "hierarchical": reduce_hierarchical.reduce,
               "binomial": reduce_binomial.reduce},
    "all_gather": {"shm": allgather_shm.all_gather, "hierarchical": allgather_hierarchical.all_gather,
                   "bruck": allgather_bruck.all_gather, "ring": allgather_ring.all_gather},
    "reduce_scatter": {"shm": reduce_scatter_shm.reduce_scatter,
                       "hierarchical": reduce_scatter_hierarchical.reduce_scatter,
                       "recursive_doubling": reduce_scatter_recursive_doubling.reduce_scatter,
                       "ring": reduce_scatter_ring.reduce_scatter},
    "all_to_all": {"shm": alltoall_shm.all_to_all, "pairwise": alltoall_pairwise.all_to_all},
    "gather": {"shm": gather_shm.gather, "linear": gather_linear.gather},
    "scatter": {"shm": scatter_shm.scatter, "linear": scatter_linear.scatter},
    "barrier": {"shm": barrier_shm.barrier, "dissemination": barrier_dissemination.barrier},
}
#: hierarchical algorithms: shared memory inside each host, the network between hosts. The
#: engine picks "hierarchical" (one leader per host); "rails" (every rank carries a slice
#: across hosts) only when forced: on this 2-core machine it used 24 % more CPU and was
#: slower (docs/algorithms.md, "Several ranks per host").
HIERARCHICAL = ("hierarchical", "rails")
NETWORK_DEFAULT = {"broadcast": "binomial", "reduce": "binomial",
                   "all_to_all": "pairwise", "gather": "linear", "scatter": "linear", "barrier": "dissemination"}


def network_all_reduce(nbytes: int, count: int, peers: int) -> str:
    """The all_reduce algorithm among ``peers`` network ranks for a buffer of ``nbytes``
    holding ``count`` elements (fewer elements than peers: the ring has nothing to split)."""
    return "recursive_doubling" if nbytes <= SMALL_ALL_REDUCE_BYTES or count < peers else "ring"


#: all_gather (bytes: its output) and reduce_scatter (its input) among network peers: the
#: latency-bound algorithm up to a size, among more than two peers; the ring above
BY_SIZE = {"all_gather": ("bruck", SMALL_ALL_GATHER_BYTES),
           "reduce_scatter": ("recursive_doubling", SMALL_ALL_REDUCE_BYTES)}


def network_by_size(collective: str, nbytes: int, peers: int) -> str:
    """The algorithm of ``collective`` (one of BY_SIZE) among ``peers`` network ranks for ``nbytes``."""
    small, limit = BY_SIZE[collective]
    return small if nbytes <= limit and peers > 2 else "ring"


#: the host stage of the hierarchical all_gather and reduce_scatter, by the network choice's name
HOST_STAGE: dict[str, dict[str, Callable[..., None]]] = {
    "all_gather": {"bruck": allgather_bruck.bruck_allgather, "ring": allgather_ring.ring_allgather},
    "reduce_scatter": {"recursive_doubling": reduce_scatter_recursive_doubling.doubling_reduce_scatter,
                       "ring": reduce_scatter_ring.ring_reduce_scatter}}


class Shape(NamedTuple):
    """A group as the choice sees it, from this rank: ``hosts`` every host's group ranks
    (hosts in the order of their lowest group rank), ``local`` this rank's host's;
    ``arenas``: a host's ranks get shared-memory arenas (shared memory on)."""
    size: int
    hosts: list[list[int]]
    local: list[int]
    arenas: bool = True

    @property
    def spans_hosts(self) -> bool:
        return len(self.hosts) > 1

    @property
    def even(self) -> bool:
        """Every host has the same number of the group's ranks."""
        return len({len(ranks) for ranks in self.hosts}) == 1


def choose(collective: str, shape: Shape, forced: str | None, arena: Callable[[], bool], nbytes: int = 0,
           count: int = 0) -> str:
    """The algorithm of ``collective`` for a call of ``nbytes`` (``count`` elements), or
    ``forced`` (PYDIST_ALGO_*: ValueError when this group cannot run it); ``arena()`` says
    whether the group has a shared-memory arena (it may make it: asked only where it matters)."""
    if forced in ("shm",) + HIERARCHICAL and not _possible(forced, shape, arena):
        raise ValueError(f"PYDIST_ALGO_{collective.upper()}={forced}: not possible for this group "
                         f"(shm needs every rank on one host with shared memory; hierarchical needs several "
                         f"hosts; rails needs several hosts with the same number of ranks, more than one)")
    if forced:
        return forced
    if shape.size > 1 and arena():
        return "shm"
    if ("hierarchical" in ALGORITHMS[collective] and shape.spans_hosts and len(shape.hosts) < shape.size
            and shape.arenas):
        return "hierarchical"
    if collective in BY_SIZE:
        return network_by_size(collective, nbytes, shape.size)
    if collective != "all_reduce":
        return NETWORK_DEFAULT[collective]
    return network_all_reduce(nbytes, count, shape.size)


def _possible(algorithm: str, shape: Shape, arena: Callable[[], bool]) -> bool:
    if algorithm == "shm":
        return shape.size == 1 or arena()
    if algorithm == "rails":
        return shape.spans_hosts and shape.even and len(shape.local) > 1
    return shape.spans_hosts
