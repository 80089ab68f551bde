"""docs/guide/security.md backs each line with a test it names (``tests/file.py::test[id]``):
every test file, test and parametrized case it names exists, so the page cannot keep citing
a test that was renamed or removed."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "guide" / "security.md"
CITED = re.compile(r"`(tests/[\w/]+\.py)(?:::(\w+)((?:\[[\w-]+\])?))?`")
MORE_IDS = re.compile(r"`(tests/[\w/]+\.py)::(\w+)\[[\w-]+\]`,\s*((?:`\[[\w-]+\]`,?\s*)+)")


def _tests_of(path: Path) -> set[str]:
    return {node.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_test_the_security_page_names_exists():
    text = PAGE.read_text()
    cited = CITED.findall(text)
    assert len(cited) > 40  # the page names its tests
    missing = []
    for file, test, case in cited:
        path = ROOT / file
        if not path.exists():
            missing.append(file)
        elif test and test not in _tests_of(path):
            missing.append(f"{file}::{test}")
        elif case and case[1:-1] not in path.read_text():  # a parametrize id, as the file spells it
            missing.append(f"{file}::{test}{case}")
    for file, test, more in MORE_IDS.findall(text):  # `file::test[a]`, `[b]`: b is a case of that test
        for case in re.findall(r"\[([\w-]+)\]", more):
            if case not in (ROOT / file).read_text():
                missing.append(f"{file}::{test}[{case}]")
    assert missing == [], missing
