# Two commands for a newcomer: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: setup lint test test-unit test-integration test-e2e demo bench crd clean

setup: $(STAMP)

# torch first: its CPU build lies on this disk, and anything depending on torch would otherwise pull a CUDA build.
# One pip call for the four distributions (operator, contracts/, sandbox/, training/): the local paths on the same
# command line satisfy the operator's pins on its siblings, so nothing is fetched for them. No build isolation: the
# four editable builds share the setuptools installed here instead of creating a build environment each (4x slower).
$(STAMP): pyproject.toml contracts/pyproject.toml sandbox/pyproject.toml training/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade "pip>=24" "setuptools==84.2.1"
	$(PIP) install --quiet "torch==2.13.0"
	$(PIP) install --quiet --no-build-isolation -e ./contracts -e ./sandbox -e ./training -e ".[train,sandbox,dev]"
	touch $(STAMP)

# ruff (lint, format check), mypy (operator and contracts; strict on reconcile/), the import contracts, and every
# noqa / type: ignore naming its codes and its reason.
# Every tool runs even when an earlier one fails, so one pass shows all findings. Config: ruff.toml, .mypy.ini,
# .importlinter. PYTHONPATH names the source folders so the import contracts see this tree, installed or not.
LINT_PYTHONPATH := operator:contracts:sandbox:.
lint: setup
	@rc=0; \
	$(VENV)/bin/ruff check . || rc=1; \
	$(VENV)/bin/ruff format --check --output-format concise . || rc=1; \
	$(VENV)/bin/mypy --config-file .mypy.ini -p sweep_operator -p sweep_contracts || rc=1; \
	PYTHONPATH=$(LINT_PYTHONPATH) $(VENV)/bin/lint-imports --config .importlinter --no-cache || rc=1; \
	$(PY) tools/check_suppressions.py || rc=1; \
	exit $$rc

# The suite in two pytest runs (docs/testing.md): unit and integration tests on TEST_WORKERS xdist workers, a test
# file per worker at a time (each worker starts its own loopback servers), then the real-Ray e2e tests on
# E2E_WORKERS. Both use more workers than the machine has cores: an operator test spends about half its time
# waiting for a state (its passes, the stand-ins, the emulator's watches), a real-Ray test waits on Ray's process
# starts, a held trial or a deadline; four and three keep two cores busy where two workers left a third to half
# idle. The second runs even when the first fails; each fails when it collects nothing or fewer tests than a layer's
# floor (min_tests in pyproject.toml).
TEST_WORKERS ?= 4
E2E_WORKERS ?= 3
# --no-loadscope-reorder: files in the order tests/conftest.py gives them (the longest first), not by test count.
XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
test: setup
	@rc=0; \
	$(PY) -m pytest tests/unit tests/integration $(XDIST) $(PYTEST_ARGS) || rc=1; \
	$(PY) -m pytest tests/e2e -n $(E2E_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS) || rc=1; \
	exit $$rc

test-unit: setup
	$(PY) -m pytest tests/unit $(XDIST) $(PYTEST_ARGS)

test-integration: setup
	$(PY) -m pytest tests/integration $(XDIST) $(PYTEST_ARGS)

test-e2e: setup
	$(PY) -m pytest tests/e2e -n $(E2E_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The demo keeps its run root and report.html under .demo/ (the sandbox's S3 lives in memory) and prints where.
demo: setup
	$(VENV)/bin/sweepctl sandbox run --sweep examples/digits-cpu.yaml --track --then-delete --state-dir .demo

bench: setup
	$(PY) bench/verify_scale.py
	$(PY) bench/commit_record_cost.py
	$(PY) bench/entrypoint_overhead.py
	$(PY) bench/operator_scale.py
	$(PY) bench/noisy_neighbours.py

# Regenerate the CRDs (and the chart's copies) from contracts/sweep_contracts/api.py.
crd: setup
	$(PY) -m sweep_operator.crd > crds/trainingsweeps.sweeps.dev.yaml
	mkdir -p charts/trainingsweep-operator/crds
	cp crds/trainingsweeps.sweeps.dev.yaml charts/trainingsweep-operator/crds/
	$(PY) -m sweep_operator.crd --ledger > crds/gpuhourledgers.sweeps.dev.yaml
	cp crds/gpuhourledgers.sweeps.dev.yaml charts/trainingsweep-operator/crds/
	$(PY) -m sweep_operator.crd --markdown > docs/trainingsweep-reference.md

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
