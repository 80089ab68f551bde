"""The framework tests run only when asked for: ``-m integration`` (``make integration``, which
installs the frameworks first) or PYDIST_INTEGRATION=1. Everywhere else (``make test``, a bare
``pytest``) they are deselected: each starts real jobs of a framework, minutes in all."""
from __future__ import annotations

import os

import pytest


def _asked_for(config: pytest.Config) -> bool:
    expression = config.getoption("markexpr") or ""
    return bool(os.environ.get("PYDIST_INTEGRATION")) or (
        "integration" in expression and "not integration" not in expression)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _asked_for(config):
        return
    deselected = [item for item in items if item.get_closest_marker("integration")]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not item.get_closest_marker("integration")]
