"""Moving bytes between ranks: one pair interface (base.py) that every transport implements
whole (tcp/, shm/, loopback.py), one Matcher per rank that they all deliver into
(matching.py, receiver.py, framing.py, flow.py), and the world transport (world.py) that
routes each peer to the network or the host-local transport, from the registry
(registry.py). Every rank number here is a transport rank."""
