"""The settings table: parsing, errors naming the variable, the site's table, no stray readers."""
from __future__ import annotations

import pathlib
import re

import pytest

from pydist.core import settings as _settings
from pydist.core.settings import VARIABLES, markdown, parse, settings

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_defaults_when_nothing_is_set():
    found = parse({})
    assert found.shm is True and found.shm_slot_bytes == 512 << 10 and found.segment_bytes == 4 << 20
    assert found.trace_buffer == 2000 and found.debug == "off" and found.backend == "pydist"
    assert found.forced_algorithms() == {}


def test_values_are_parsed():
    found = parse({"PYDIST_SHM": "0", "PYDIST_SHM_SLOT_BYTES": "256", "PYDIST_ALGO_ALL_REDUCE": "ring",
                   "PYDIST_DEBUG": "DETAIL", "PYDIST_BACKEND": "MPI", "PYDIST_TRACE_DIR": "/tmp/t"})
    assert (found.shm, found.shm_slot_bytes, found.debug, found.backend, found.trace_dir) == (
        False, 256, "detail", "mpi", "/tmp/t")
    assert found.forced_algorithms() == {"all_reduce": "ring"}


def test_an_empty_value_means_the_default():
    assert parse({"PYDIST_SHM": "", "PYDIST_TRACE_BUFFER": ""}) == parse({})


@pytest.mark.parametrize("name, text, expected", [
    ("PYDIST_SHM", "yes", "expected 0 or 1"),
    ("PYDIST_SHM_RING_BYTES", "1000", "multiple of 64"),
    ("PYDIST_SHM_RING_BYTES", "64", "at least 4096"),
    ("PYDIST_SHM_SLOT_BYTES", "-64", "whole number"),
    ("PYDIST_SEGMENT_BYTES", "0", "at least 1"),
    ("PYDIST_TRACE_BUFFER", "many", "whole number"),
    ("PYDIST_ALGO_BROADCAST", "ring", "expected one of shm, hierarchical, rails, binomial"),
    ("PYDIST_DEBUG", "verbose", "expected one of off, info, detail"),
    ("PYDIST_BACKEND", "nccl", "expected one of pydist, mpi"),
])
def test_a_bad_value_names_the_variable_and_what_it_expects(name, text, expected):
    with pytest.raises(ValueError) as raised:
        parse({name: text})
    assert f"{name}={text!r}" in str(raised.value) and expected in str(raised.value)


def test_settings_follows_the_environment(monkeypatch):
    monkeypatch.setenv("PYDIST_SEGMENT_BYTES", "4096")
    first = settings()
    assert first.segment_bytes == 4096 and settings() is first  # parsed once while unchanged
    monkeypatch.setenv("PYDIST_SEGMENT_BYTES", "8192")
    assert settings().segment_bytes == 8192


def test_the_secret_is_not_shown():
    assert "hunter2" not in repr(parse({"PYDIST_AUTH_TOKEN": "hunter2"}))


def test_the_algorithm_choices_are_the_engines():
    from pydist.engines.choice import ALGORITHMS
    assert {c: tuple(names) for c, names in ALGORITHMS.items()} == _settings.ALGORITHM_CHOICES


def test_the_site_shows_the_table():
    """docs/reference/settings.md holds the marker that `make docs` replaces with markdown()."""
    page = (ROOT / "docs" / "reference" / "settings.md").read_text()
    assert "<!-- pydist:settings -->" in page
    assert "| `PYDIST_SHM` | 1 | 0 / 1 |" in markdown()


def test_no_module_reads_a_pydist_variable_itself():
    """Every PYDIST_* read goes through the table (tests and the launcher may *set* them)."""
    offenders = []
    for path in (ROOT / "src" / "pydist").rglob("*.py"):
        if path.name == "core/settings.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"environ(\.get)?\(?\[?\s*[\"']PYDIST_|getenv\([\"']PYDIST_", line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
            for name in re.findall(r"PYDIST_[A-Z_]*[A-Z](?![A-Z_*])", line):
                if name not in VARIABLES and not name.startswith("PYDIST_ALGO"):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {name} is not in the table")
            for family in re.findall(r"(PYDIST_[A-Z_]+)\*", line):  # PYDIST_TLS_*: some variables
                if not any(variable.startswith(family) for variable in VARIABLES):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: no variable is {family}*")
    assert not offenders, "\n".join(offenders)
