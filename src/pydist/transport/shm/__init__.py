"""pydist.transport.shm.transport."""
