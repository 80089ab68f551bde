"""pydist.core."""
