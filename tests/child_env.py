"""The environment of child processes that run the tests' programs.

Under pytest, tests/ is on sys.path (pyproject's ``pythonpath``), so the helper packages
(seed_programs, ddp_programs, torch_programs, run_scripts) and test modules import by name, and
multiprocessing children inherit that. A program started as a command (``python
tests/torch_programs/ddp_tutorial.py`` under a launcher, ``mpiexec python ...``) gets it from
its environment: ``with_tests_on_path``.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def with_tests_on_path(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with tests/ first on PYTHONPATH."""
    result = dict(os.environ if env is None else env)
    result["PYTHONPATH"] = os.pathsep.join(path for path in (str(TESTS), result.get("PYTHONPATH")) if path)
    return result
