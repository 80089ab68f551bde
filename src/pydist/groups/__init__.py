"""pydist.groups."""
