"""Backends: the engines that run a group's operations (native: pydist's own; mpi: mpi4py)."""
