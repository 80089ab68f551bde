"""Installing pydist into one's own environment as getting started says (issue 48): ``pip install
/path/to/pydist`` (a copy of this checkout's package files) into a fresh venv, no system site
packages, so nothing of this checkout or of the test venv is seen; then getting started's
programs, README's, the shipped examples and the DDP page's example run from a directory
outside the repository with the commands the pages show. torch comes from a local wheel file
of the running torch's version (pip's find-links), else that part is skipped: PyPI's torch is
the CUDA build, gigabytes."""
from __future__ import annotations

import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_docs_examples import BLOCK, LAUNCHED

from pydist.testing.commands import run_command

#: a venv, pip and real jobs: 1-3 minutes; pip's installs (the fixture's counts in the first test's
#: time) have bounds of their own, the whole is bounded past pyproject's 120 s per test
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parent.parent
GETTING_STARTED = (ROOT / "docs" / "getting-started.md").read_text()
INSTALL = "pip install /path/to/pydist"
COLLECTIVES = "pydist-run --nproc-per-node 4 -m pydist.examples.collectives"
TRAIN = "pydist-run --nproc-per-node 2 -m pydist.examples.train"
PIP_SECONDS = 600.0  # pip on a loaded machine, from the local index


def _env() -> dict[str, str]:
    """This environment less what would show the venv this checkout (PYTHONPATH) or another venv."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}


def _ok(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    done = run_command(argv, cwd=cwd, timeout=timeout, env=_env())
    assert done.returncode == 0, f"{shlex.join(argv)}\n{done.stdout}\n{done.stderr}"
    return done


def _programs(page: Path) -> list[tuple[str, str, list[str]]]:
    """(file name, code, the launcher's arguments or [] for plain python) of each Python block of ``page``."""
    found = []
    for index, match in enumerate(BLOCK.finditer(page.read_text())):
        code = match.group(1)
        launched = LAUNCHED.match(code.splitlines()[0])
        name = launched.group(2) if launched else f"program{index}.py"
        found.append((name, code, shlex.split(launched.group(1)) if launched else []))
    return found


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> tuple[Path, Path]:
    """(the fresh venv's bin/, an empty working directory), pydist installed as the page says."""
    assert INSTALL in GETTING_STARTED
    top = tmp_path_factory.mktemp("install")
    checkout = top / "pydist"  # what a user's checkout holds that pip reads
    shutil.copytree(ROOT / "src", checkout / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, checkout / name)
    _ok([sys.executable, "-m", "venv", str(top / "venv")], top, timeout=PIP_SECONDS)
    bin_dir = top / "venv" / "bin"
    _ok([str(bin_dir / "pip"), "install", "--quiet", str(checkout)], top, timeout=PIP_SECONDS)
    work = top / "work"
    work.mkdir()
    where = _ok([str(bin_dir / "python"), "-c", "import pydist; print(pydist.__file__)"], work).stdout.strip()
    assert where.startswith(str(top / "venv")), where  # the installed copy, not an editable one
    return bin_dir, work


def _run_page(page: Path, bin_dir: Path, work: Path) -> list[subprocess.CompletedProcess]:
    results = []
    for name, code, launcher_args in _programs(page):
        (work / name).write_text(code)
        runner = [str(bin_dir / "pydist-run"), *launcher_args] if launcher_args else [str(bin_dir / "python")]
        command = [*runner, name]
        results.append(_ok(command, work))
    return results


def test_getting_started_s_and_readme_s_programs_and_the_shipped_examples_run(venv):
    bin_dir, work = venv
    first, hello = _run_page(ROOT / "docs" / "getting-started.md", bin_dir, work)
    assert "rank 0 of 1 -> [0. 1. 2. 3.]" in first.stdout
    assert len(first.stderr.splitlines()) <= 1 and all(len(line) <= 160 for line in first.stderr.splitlines())
    assert "[rank3]:rank 3/4: [ 6. 10. 14. 18.]" in hello.stdout, hello.stdout
    _run_page(ROOT / "README.md", bin_dir, work)
    assert COLLECTIVES in GETTING_STARTED
    tour = _ok([str(bin_dir / "pydist-run"), *shlex.split(COLLECTIVES)[1:]], work)
    assert "all_reduce SUM         [16, 20]" in tour.stdout, tour.stdout


def _local_torch_wheel() -> str | None:
    """A wheel file of the running torch's version in pip's find-links folders, if any."""
    torch = pytest.importorskip("torch")
    version = torch.__version__.split("+")[0]
    for folder in os.environ.get("PIP_FIND_LINKS", "").split():
        found = sorted(glob.glob(os.path.join(folder, f"torch-{version}*.whl")))
        if found:
            return found[0]
    return None


def test_the_ddp_example_runs_and_the_demo_says_what_it_needs(venv):
    bin_dir, work = venv
    wheel = _local_torch_wheel()
    if wheel is None:
        pytest.skip("no local torch wheel of the running torch's version in PIP_FIND_LINKS")
    # --no-compile: torch's 2,371 modules are not compiled to bytecode ahead (~10 s of CPU here);
    # the example imports only what it uses, compiled as it does
    _ok([str(bin_dir / "pip"), "install", "--quiet", "--no-compile", wheel], work, timeout=PIP_SECONDS)
    ddp_page = ROOT / "docs" / "guide" / "ddp.md"
    name, code, launcher_args = _programs(ddp_page)[0]
    assert name == "train_ddp.py" and "DistributedDataParallel" in code
    (work / name).write_text(code)
    _ok([str(bin_dir / "pydist-run"), *launcher_args, name], work)
    assert TRAIN in GETTING_STARTED and 'pip install "/path/to/pydist[demo]"' in GETTING_STARTED
    demo = run_command([str(bin_dir / "pydist-run"), *shlex.split(TRAIN)[1:], "--epochs", "1"], cwd=work,
                       timeout=120, env=_env())
    assert demo.returncode != 0 and re.search(r"pip install scikit-learn .*pydist\[demo\]", demo.stderr), demo.stderr
