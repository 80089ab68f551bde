# Two commands on a fresh machine: `make demo`, `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
TORCH := torch==2.13.0
MPI := mpi4py mpich
PYTEST_ARGS ?=
# make test's pytest-xdist workers: two, each with a /dev/shm of its own (tests/private_shm.py),
# where a throwaway process shows that one can be made (root with CAP_SYS_ADMIN); elsewhere 0
# (one process). Most tests start ranks and then wait on them, so two workers on 2 cores take
# ~10 min where one takes ~15.
TEST_WORKERS ?= $(shell $(PYTHON) tests/private_shm.py >/dev/null 2>&1 && echo 2 || echo 0)

.PHONY: demo test test-fast soak torch-suite torch-suite-as-gloo lint bench venv test-venv docs gpu-check clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[demo]' $(TORCH)
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install --quiet -e '.[test,bench,demo]' $(TORCH) $(MPI) expecttest
	touch $@

venv: $(VENV)/.installed

test-venv: $(VENV)/.installed-test

demo: venv
	$(VENV)/bin/pydist-run --nproc-per-node 2 -m pydist.examples.train

# pytest rewrites every test module's asserts when it imports it; with bytecode allowed it
# keeps the rewritten modules in __pycache__ (collection: ~10 s -> ~6 s here). Environments
# that set PYTHONDONTWRITEBYTECODE (this one does) would rewrite them on every run.
PYTEST := PYTHONDONTWRITEBYTECODE= $(PY) -m pytest

test: test-venv
	$(PYTEST) -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The edit-run loop: everything but the tests marked slow (and soak), under 45 s on 2 cores.
test-fast: test-venv
	$(PYTEST) -m "not slow and not soak" $(PYTEST_ARGS)

# Frameworks on pydist against gloo, 2 ranks each (tests/integration/, marker integration, which
# make test deselects): Lightning, Fabric, accelerate, torch DCP, Ray Train, DeepSpeed ZeRO, submitit. Their
# install (pyproject's integration extra) takes about a minute and 0.5 GB on top of the test venv,
# the tests 5-7 minutes on 2 cores; -rP prints each test's gloo and pydist results side by side.
# faulthandler's stack dump (100 s in pyproject) is pushed past the longest test (Ray Train, ~3 min).
INTEGRATION_ARGS ?= -q -rfEsP --durations=10 -o faulthandler_timeout=600
$(VENV)/.installed-integration: $(VENV)/.installed-test
	$(PIP) install --quiet -e '.[integration]' $(TORCH)
	touch $@

.PHONY: integration
integration: $(VENV)/.installed-integration
	$(PYTEST) -m integration tests/integration $(INTEGRATION_ARGS) $(PYTEST_ARGS)

# torch's own distributed suite against the plugin; pytest and expecttest live in the test venv.
# The long robustness runs (tests/test_robustness_soak.py) and the launcher's 400 simultaneous
# starts (tests/test_launcher_endpoint_soak.py); the dump of every thread's stack is moved
# to just before the 20-minute bound: at 100 s it crashed the interpreter inside hypothesis.
soak: test-venv
	PYDIST_SOAK=1 timeout 1200 $(PY) -m pytest -m soak -o faulthandler_timeout=1150 tests/test_robustness_soak.py tests/test_launcher_endpoint_soak.py $(PYTEST_ARGS)

torch-suite: test-venv
	BACKEND=pydist WORLD_SIZE=2 $(PY) -m pytest tests/torch_suite/torch_distributed_suite.py -q $(PYTEST_ARGS)

torch-suite-as-gloo: test-venv
	WORLD_SIZE=2 $(PY) -m pytest tests/torch_suite/torch_distributed_suite_as_gloo.py -q $(PYTEST_ARGS)

# The plugin's torch tests (tests/test_torch_*.py and the TCPStore protocol; TORCH_MATRIX_TESTS
# to change) against each torch release of TORCH_VERSIONS, one venv each (.venv-torch-<version>,
# made on first use and kept), then a table of passes and failures per release
# (tools/torch_matrix.sh). PyPI's torch wheels are the CUDA builds, whose nvidia-* libraries torch
# loads at import: a venv is 5-7 GB and 2.5 minutes to make on a quiet machine (2.13.0 here: the
# local +cpu wheel, 1 GB). Not in `make test`: 15-25 minutes a release on 2 cores.
TORCH_VERSIONS ?= 2.8.0 2.11.0 2.13.0 2.14.1
.PHONY: torch-matrix
torch-matrix:
	TORCH_VERSIONS="$(TORCH_VERSIONS)" PYTHON=$(PYTHON) sh tools/torch_matrix.sh

# The site (docs/, Sphinx + furo + MyST; docs/about-the-site.md says why) into build/docs/html.
# -E: read every page again (generated parts change without their page changing).
# -W: every warning fails the build (broken cross-references and links inside the site included);
# docs/_ext/pydist_docs.py fails it for a public name without a docstring.
$(VENV)/.installed-docs: $(VENV)/.installed-test  # test: make docs runs the built site's checks with pytest
	$(PIP) install --quiet -e '.[docs]'
	touch $@

docs: $(VENV)/.installed-docs
	$(VENV)/bin/sphinx-build -E -W --keep-going -q -b html docs build/docs/html
	$(PYTEST) -q tests/test_docs_site.py  # the built site's checks: make test skips them without Sphinx

lint: test-venv
	$(VENV)/bin/ruff check src tests
	$(VENV)/bin/mypy

bench: test-venv
	$(VENV)/bin/pydist-bench --op all_reduce --nproc 2 --sizes 4:256M --compare gloo,mpi
	$(VENV)/bin/pydist-bench --op all_reduce --nproc 4 --sizes 4:256M --compare gloo,mpi

# On a machine with a CUDA GPU: the checks of issue 47 item 6 (tools/gpu_check.py; docs/guide/gpu.md), from
# the source tree, no venv; one line and exit 0 without a GPU. `--device standin` runs them on the stand-in.
gpu-check:
	sh tools/gpu_check.sh

clean:
	rm -rf $(VENV) build src/*.egg-info
