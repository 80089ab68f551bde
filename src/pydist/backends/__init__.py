"""Backends: the engines that run a group's operations (native: pydist's own; mpi: MPI through
mpi4py, with its _mpi_* helpers, imported only when a group uses it)."""
