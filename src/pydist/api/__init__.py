"""pydist.api."""
