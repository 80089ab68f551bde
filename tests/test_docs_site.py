"""The built site (``make docs``) keeps what readers copy as typed (issue 48): no en or em dash
where a flag's ``--`` was typed. docutils' smartquotes turned ``--nproc`` into ``–nproc`` in
prose, on the generated CLI and settings pages and in the changelog; docs/conf.py turns it off."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from pydist.testing.commands import run_command

pytest.importorskip("sphinx", reason="needs the docs extra (make docs installs it: pip install -e '.[docs]')")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a whole Sphinx build: 20-60 s

ROOT = Path(__file__).resolve().parent.parent
#: an en or em dash that starts a word and runs into a name: "–nproc", "(–iters", "[–link"
DASHED_FLAG = re.compile(r"(?<![\w\u2013\u2014-])[\u2013\u2014]+[A-Za-z][\w-]*")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    done = run_command([sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "html",
                        str(ROOT / "docs"), str(out)], timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def test_no_dash_stands_for_a_flag_s_two_hyphens(site):
    found = {}
    for page in sorted(site.rglob("*.html")):
        hits = DASHED_FLAG.findall(page.read_text())
        if hits:
            found[str(page.relative_to(site))] = sorted(set(hits))[:5]
    assert found == {}, found


def test_the_generated_pages_show_flags_as_typed(site):
    cli = (site / "reference" / "cli.html").read_text()
    assert "a different --nproc is an error" in cli and "a small all_reduce (--iters calls)" in cli  # help texts
    assert "PYDIST_" in (site / "reference" / "settings.html").read_text()


def test_api_pages_spell_reduce_ops_as_users_do(site):
    """The sources' defaults name the enum (RedOpType.SUM); users write ReduceOp.SUM, which it is."""
    collectives = (site / "api" / "collectives.html").read_text()
    defaults = re.findall(r'<span class="default_value"><span class="pre">(\w+)\.SUM</span>', collectives)  # op=...
    assert defaults and set(defaults) == {"ReduceOp"}, defaults
