"""Collective algorithms: one module per (collective, algorithm), each a schedule of
send/recv/reduce steps over a Comm (no sockets, no shared memory here)."""
