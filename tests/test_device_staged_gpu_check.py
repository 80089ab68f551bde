"""gpu-check 8 (tools/gpu_check_staged.py) on the strict stand-in and on its copy-engine model:
the chunk edges right, both throughput modes run, one row."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


@pytest.mark.slow
@pytest.mark.device
@pytest.mark.parametrize("kind", ["standin", "model"])
def test_check_8_passes_off_a_gpu(kind):
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))  # the spawned ranks import it by name
    from gpu_check_staged import staged_loopback

    status, detail = staged_loopback(kind, sizes=(96 << 10,), chunk=16 << 10, iters=1, limit=120.0)
    assert status == "PASS", detail
    assert detail.startswith("13 chunk-edge cases right; 96 KiB: pipelined "), detail
    assert "serial" in detail and "gloo" not in detail
