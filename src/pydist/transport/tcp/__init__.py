"""The network transport over TCP: a connection per pair of ranks and lane (mesh.py sets
them up, mesh_tls.py secures them), each peer's connection (connection.py), the I/O thread
and the caller that borrows its sockets (poller.py), striping over lanes (stripes.py)."""
