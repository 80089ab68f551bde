"""Shared memory between the ranks of one host: the rings of the host-local transport
(transport.py), the arenas the shm algorithms compute in (arena.py), the segments both live
in (segment.py), and the doorbells and atomics they wait and publish with."""
