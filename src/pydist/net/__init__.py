"""pydist.net."""
