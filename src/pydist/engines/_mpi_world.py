"""The MPI side of pydist's MPI engine: loading mpi4py, COMM_WORLD, communicators per group.

``mpi_world()`` imports mpi4py (which initialises MPI with MPI_THREAD_MULTIPLE, its default)
and makes the process's MpiWorld once: a duplicate of COMM_WORLD used only to create
group communicators, the host name of every rank and MPI's largest tag. The first call is
collective over COMM_WORLD (every rank calls it from init_process_group, or from the torch
plugin's default group). ``communicator(ranks)`` is collective over ``ranks`` only
(MPI_Comm_create_group), so ranks outside a new group send nothing. Creating
communicators is blocking MPI without a timeout: it returns once every member arrives.

Fails with RuntimeError when mpi4py cannot be imported or MPI gives less than
MPI_THREAD_MULTIPLE (pydist calls MPI from the caller's thread, each group's progress
thread and the point-to-point poller).
"""
from __future__ import annotations

import collections
import hashlib
import threading
from typing import Any

MPI: Any = None  # the mpi4py.MPI module, once loaded
_WORLD: MpiWorld | None = None
_LOCK = threading.Lock()


def load_mpi() -> Any:
    """mpi4py.MPI, initialised with MPI_THREAD_MULTIPLE; RuntimeError naming the fix otherwise."""
    global MPI
    if MPI is None:
        try:
            from mpi4py import MPI as module
        except ImportError as error:
            raise RuntimeError("the MPI backend needs mpi4py and an MPI library "
                               "(pip install mpi4py mpich), and a launch by mpiexec or srun") from error
        provided = module.Query_thread()
        if provided < module.THREAD_MULTIPLE:
            raise RuntimeError(f"the MPI backend needs MPI_THREAD_MULTIPLE; MPI was initialised with thread "
                               f"level {provided} (leave mpi4py.rc.thread_level at 'multiple' before importing "
                               "mpi4py.MPI)")
        MPI = module
    return MPI


class MpiWorld:
    """COMM_WORLD as pydist sees it: rank, size, host names, and a communicator for making others."""

    def __init__(self) -> None:
        mpi = load_mpi()
        self.control = mpi.COMM_WORLD.Dup()
        self.control.Set_errhandler(mpi.ERRORS_RETURN)
        self.rank = self.control.Get_rank()
        self.size = self.control.Get_size()
        self.hosts: list[str] = self.control.allgather(mpi.Get_processor_name())
        self.tag_ub = int(mpi.COMM_WORLD.Get_attr(mpi.TAG_UB))
        self._made: collections.Counter = collections.Counter()

    def _creation_tag(self, ranks: tuple[int, ...]) -> int:
        """A tag equal on every member: the rank list and how many times it was used (every
        member creates its groups in the same order)."""
        self._made[ranks] += 1
        text = f"{','.join(map(str, ranks))}:{self._made[ranks]}".encode()
        return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") % (self.tag_ub + 1)

    def communicator(self, ranks: list[int]):
        """A new communicator of world ranks ``ranks`` (in that order); only they call this."""
        mpi = load_mpi()
        with _LOCK:
            tag = self._creation_tag(tuple(ranks))
        world_group = self.control.Get_group()
        group = world_group.Incl(list(ranks))
        try:
            comm = self.control.Create_group(group, tag)
        finally:
            group.Free()
            world_group.Free()
        comm.Set_errhandler(mpi.ERRORS_RETURN)
        return comm


def mpi_world() -> MpiWorld:
    """The process's MpiWorld (made by the first call, which is collective over COMM_WORLD)."""
    global _WORLD
    if _WORLD is None:
        with _LOCK:
            if _WORLD is None:
                _WORLD = MpiWorld()
    return _WORLD


def rank_and_size(rank: int = -1, world_size: int = -1) -> tuple[int, int]:
    """This process's rank and the world size, from MPI. A ``rank`` or ``world_size`` given
    (not -1) that differs from MPI's raises ValueError naming both."""
    world = mpi_world()
    for name, given, actual in (("rank", rank, world.rank), ("world_size", world_size, world.size)):
        if given is not None and given != -1 and given != actual:
            raise ValueError(f"{name}: {given} was given, but MPI assigns {name} {actual} to this process "
                             f"(the MPI backend takes rank and world_size from MPI.COMM_WORLD; pass -1 or "
                             "MPI's value)")
    return world.rank, world.size
