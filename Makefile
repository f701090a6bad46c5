# Two commands do all set-up: `make run` (the main job) and `make test` (lint with ruff, then the test suite, spread
# over the machine's cores, at most 4 pytest-xdist workers).
# Each creates the virtual environment in .venv if it is missing (torch pinned to the CPU wheel 2.13.0).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.w2s-shift-installed
# the machine's local torch CPU wheel, when present (an unpinned index would pull a multi-GB CUDA build)
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

.PHONY: run test bench clean-venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q $(FIND_LINKS) -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/w2s-shift run $(ARGS)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 $(ARGS)

clean-venv:
	rm -rf $(VENV)
