"""DebugLevel, get_debug_level, set_debug_level and set_debug_level_from_env answer as torch
2.13's: one level per process, read from TORCH_DISTRIBUTED_DEBUG at import and on request."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import pydist
from pydist import DebugLevel

torch = pytest.importorskip("torch")
import torch.distributed as tdist  # noqa: E402

MUST_BE = "The value of TORCH_DISTRIBUTED_DEBUG must be OFF, INFO, or DETAIL"


@pytest.fixture(autouse=True)
def levels_kept(monkeypatch):
    """Both libraries' levels as they were before the test (the variable: monkeypatch's)."""
    ours, theirs = pydist.get_debug_level(), tdist.get_debug_level()
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
    yield
    pydist.set_debug_level(ours)
    tdist.set_debug_level(theirs)


def test_the_levels_are_torchs():
    assert list(DebugLevel.__members__) == list(tdist.DebugLevel.__members__) == ["OFF", "INFO", "DETAIL"]
    for name, theirs in tdist.DebugLevel.__members__.items():
        ours = DebugLevel[name]
        assert (ours.name, ours.value, int(ours), str(ours), repr(ours)) == (
            theirs.name, theirs.value, int(theirs), str(theirs), repr(theirs))
        assert DebugLevel(int(ours)) is ours and [0, 1, 2][ours] == int(ours)
        assert (ours == int(ours)) is (theirs == int(theirs)) is False  # a level is not an int
    for module in (pydist, tdist):
        with pytest.raises(TypeError):
            _ = module.DebugLevel.INFO < module.DebugLevel.DETAIL


@pytest.mark.parametrize("text", [None, "OFF", "off", "INFO", "info", "DETAIL", "Detail"])
def test_a_valid_variable_sets_the_level_as_torchs(monkeypatch, text):
    if text is not None:
        monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", text)
    pydist.set_debug_level(DebugLevel.INFO)
    tdist.set_debug_level(tdist.DebugLevel.INFO)
    pydist.set_debug_level_from_env()
    tdist.set_debug_level_from_env()
    assert pydist.get_debug_level().name == tdist.get_debug_level().name == (text or "OFF").upper()


@pytest.mark.parametrize("text", ["", "bogus", "1", " INFO", "DEBUG"])
def test_an_invalid_variable_raises_as_torchs_and_keeps_the_level(monkeypatch, text):
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", text)
    pydist.set_debug_level(DebugLevel.DETAIL)
    tdist.set_debug_level(tdist.DebugLevel.DETAIL)
    for module in (pydist, tdist):
        with pytest.raises(ValueError, match=MUST_BE):
            module.set_debug_level_from_env()
    with pytest.raises(ValueError, match=f"got {text!r}"):
        pydist.set_debug_level_from_env()
    assert pydist.get_debug_level().name == tdist.get_debug_level().name == "DETAIL"


def test_set_debug_level_takes_a_level_only():
    for level in DebugLevel:
        pydist.set_debug_level(level)
        assert pydist.get_debug_level() is level
    for wrong in (1, "INFO", None, tdist.DebugLevel.INFO):
        with pytest.raises(TypeError, match="set_debug_level: expected a pydist.DebugLevel"):
            pydist.set_debug_level(wrong)
    for wrong in (1, "INFO", None, DebugLevel.INFO):  # torch's refuses them too
        with pytest.raises(TypeError):
            tdist.set_debug_level(wrong)


def _import_pydist_with(text: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCH_DISTRIBUTED_DEBUG": text}
    return subprocess.run([sys.executable, "-c", "import pydist; print(pydist.get_debug_level())"],
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_importing_pydist_reads_the_variable_as_importing_torch_does():
    found = _import_pydist_with("detail")
    assert found.returncode == 0 and found.stdout == "DebugLevel.DETAIL\n", found.stderr
    found = _import_pydist_with("verbose")
    assert found.returncode != 0 and f"ValueError: {MUST_BE}; got 'verbose'." in found.stderr
