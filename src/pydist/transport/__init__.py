"""pydist.transport."""
