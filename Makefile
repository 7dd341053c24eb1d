# Two commands a newcomer needs: `make demo` and `make test`. Each creates/updates .venv itself.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

LOCK   := constraints.txt

.PHONY: demo test test-slow mutation bench venv lock clean

# The venv gets the versions in constraints.txt (what CI tested), whatever PyPI has today.
$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip -c $(LOCK)
	$(BIN)/python -m pip install --quiet -e '.[dev]' -c $(LOCK)
	touch $(STAMP)

venv: $(STAMP)

# ARGS passes options on, e.g. `make demo ARGS="--set run.steps=200"`, `make bench ARGS=--quick`.
ARGS ?=

demo: $(STAMP)
	$(BIN)/tgsim demo $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest

# The slow statistical tier (e.g. the pooled unbiasedness test at 0.1 % on 10^6 elements).
test-slow: $(STAMP)
	TGSIM_SLOW=1 $(BIN)/python -m pytest -m slow

# Mutation testing (slow, not part of `make test`): tools/mutation.py mutates optim.py,
# analysis/unbiasedness.py and the NumPy codec/exchange modules one change at a time and reports
# which mutants the tests miss. One module: `make mutation ARGS=tgsim/train/optim.py`.
mutation: $(STAMP)
	$(BIN)/python tools/mutation.py $(ARGS)

bench: $(STAMP)
	$(BIN)/tgsim bench codec $(ARGS)

# Upgrade: resolve the newest versions pyproject.toml allows in a scratch venv and write them to
# constraints.txt; then `make test` (the venv follows the new lock) and commit both.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet --upgrade pip
	.lock-venv/bin/python -m pip install --quiet -e '.[dev]'
	{ sed -n '1,2p' $(LOCK); .lock-venv/bin/python -m pip freeze --all --exclude-editable | grep -v -e '^setuptools==' -e '^tgsim'; } > $(LOCK).new
	mv $(LOCK).new $(LOCK) && rm -rf .lock-venv

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
