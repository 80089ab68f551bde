"""gpu-check 8 (tools/gpu_check_staged.py) off a GPU: its throughput half on the copy-engine
model (the schedule alone: numpy memory, a thread as the copy engine), both modes run, one
row. The whole check on the stand-in runs in tests/test_device_gpu_check.py."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


@pytest.mark.slow
@pytest.mark.device
def test_check_8s_throughput_runs_on_the_model():
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))  # the spawned ranks import it by name
    from gpu_check_staged import staged_loopback

    status, detail = staged_loopback("model", sizes=(96 << 10,), chunk=16 << 10, iters=1, limit=120.0)
    assert status == "PASS", detail
    assert detail.startswith("96 KiB: pipelined ") and "serial" in detail and "gloo" not in detail, detail
