"""4 B ping-pong between ranks 0 and 1, per layer (one-way us, best of 3 x N).

Run: pydist-run --nproc-per-node 2 tools/p2p_layers.py [iterations]
Layers: dist.send/recv; the group's engine isend/irecv + Request.wait; the world
transport's isend/irecv + wait (what the engine calls).
"""
import numpy as np
from _layer_timing import best

import pydist as dist


def main():
    dist.init_process_group("pydist")
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    buf = np.zeros(1, np.float32)
    group = dist.group.WORLD
    engine = group.engine
    transport = engine.transport
    key = engine._p2p_key(0)
    view = memoryview(buf).cast("B")

    def api():
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)

    def eng():
        if rank == 0:
            engine.isend(buf, 1, 0).wait(None)
            engine.irecv(buf, 1, 0).wait(None)
        else:
            engine.irecv(buf, 0, 0).wait(None)
            engine.isend(buf, 0, 0).wait(None)

    def world():
        if rank == 0:
            transport.isend(peer, view, key).wait(None)
            transport.irecv(peer, view, key).wait(None)
        else:
            transport.irecv(peer, view, key).wait(None)
            transport.isend(peer, view, key).wait(None)

    rows = [(name, best(f, per_call=2)) for name, f in (("dist.send/recv", api), ("engine isend/irecv", eng),
                                              ("world transport", world))]
    if rank == 0:
        for name, us in rows:
            print(f"{name:22s} {us:7.1f} us one way")
    dist.destroy_process_group()


main()
