"""Imported first by a seed program run as a script (``python tests/seed_programs/seed000.py``,
alone or under a launcher): puts tests/ on sys.path, so that its ``seed_programs.*`` imports
work as when the tests import it as ``seed_programs.seed000`` (and spawned ranks unpickle its
functions by that name)."""
import os
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if TESTS not in sys.path:
    sys.path.insert(0, TESTS)
