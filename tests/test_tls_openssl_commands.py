"""The openssl commands of the TLS section (docs/guide/networks.md) make files pydist's mutual
TLS takes (issue 48): run as the page shows them, then a two-rank job over TCP (no shared
memory) on ``pydist-run --tls-cert node.pem --tls-key node.key --tls-ca ca.pem``."""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from pydist.testing.commands import run_command

pytestmark = pytest.mark.slow  # openssl and a launched job: 2-5 s

PAGE = Path(__file__).resolve().parent.parent / "docs" / "guide" / "networks.md"
WORKER = """
import numpy as np
import pydist as dist
from pydist.net import tls
assert tls.contexts() is not None  # the job's connections are on TLS
dist.init_process_group("pydist")
t = np.ones(4, np.float32) * (dist.get_rank() + 1)
dist.all_reduce(t)
print("sum", t.tolist(), flush=True)
dist.destroy_process_group()
"""


def _openssl_block() -> str:
    blocks = re.findall(r"^```bash\n(.*?)^```", PAGE.read_text(), re.S | re.M)
    return next(block for block in blocks if "openssl req -x509" in block)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_page_s_openssl_commands_make_a_working_tls_job(tmp_path):
    made = run_command(["bash", "-e", "-c", _openssl_block()], cwd=tmp_path, timeout=60)
    assert made.returncode == 0, made.stderr
    (tmp_path / "worker.py").write_text(WORKER)
    env = {**os.environ, "PYDIST_SHM": "0"}
    done = run_command([sys.executable, "-m", "pydist.run", "--nproc-per-node", "2", "--tls-cert", "node.pem",
                        "--tls-key", "node.key", "--tls-ca", "ca.pem", "worker.py"], cwd=tmp_path, timeout=90,
                       env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("sum [3.0, 3.0, 3.0, 3.0]") == 2, done.stdout
