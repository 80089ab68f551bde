"""Engines: what runs a group's operations (native: pydist's own algorithms over its
transports; mpi: MPI through mpi4py, with its _mpi_* helpers, imported only when a group
uses it). "Backend" is torch's word for the name a group is created with (``Backend``)."""
