"""pydist.transport.tcp.transport."""
