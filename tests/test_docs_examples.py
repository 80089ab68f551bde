"""Every Python example of the site (docs/**/*.md) and of README.md runs, and the site's
generator check passes.

An example whose first line is ``# run: pydist-run ARGS NAME.py`` runs under the launcher with
those arguments (2-4 ranks); any other runs as one process. Each runs as its own script in a
scratch directory and must exit 0; the examples check their results with ``assert``.
"""
from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from pydist.testing.commands import run_command

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts) + [ROOT / "README.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
LAUNCHED = re.compile(r"# run: pydist-run (.*) (\w+\.py)\s*$")
TORCH = re.compile(r"^import torch|^from torch", re.M)  # importing torch alone takes seconds


def examples() -> list:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            code = match.group(1)
            launched = LAUNCHED.match(code.splitlines()[0])
            marks = [pytest.mark.slow] if launched or "multiprocessing" in code or TORCH.search(code) else []
            found.append(pytest.param(code, id=f"{page.relative_to(ROOT)}:{line}", marks=marks))
    return found


@pytest.mark.parametrize("code", examples())
def test_example_runs(code, tmp_path):
    if TORCH.search(code):
        pytest.importorskip("torch")
    launched = LAUNCHED.match(code.splitlines()[0])
    script = tmp_path / (launched.group(2) if launched else "example.py")
    script.write_text(code)
    if launched:
        command = [sys.executable, "-m", "pydist.run", *shlex.split(launched.group(1)), str(script)]
    else:
        command = [sys.executable, str(script)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = run_command(command, cwd=tmp_path, timeout=90, env=env)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout}\n{done.stderr}"


def test_the_pages_have_examples():
    assert len(examples()) >= 10


def test_every_public_name_has_a_docstring():
    """What `make docs` checks first (docs/_ext/pydist_docs.py)."""
    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    try:
        import pydist_docs
    finally:
        sys.path.remove(str(ROOT / "docs" / "_ext"))
    assert pydist_docs.missing_docstrings() == []
