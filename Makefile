# Two entry points, each a single command on a fresh machine with Python 3.11:
#   make demo   — set up (venv, package, graphviz, fonts) and run the offline demo
#   make test   — set up (plus test tools, chromium) and run the test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: setup demo test test-fast lint bench mutate clean

$(BIN)/sop: pyproject.toml
	bash .ci/system-deps graphviz fonts-liberation fonts-wqy-microhei
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(BIN)/sop

setup: $(BIN)/sop

demo: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" bash examples/demo.sh

test: setup
	bash .ci/system-deps chromium fonts-liberation fonts-wqy-microhei
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy
	$(BIN)/python -m pytest

test-fast: setup
	$(BIN)/python -m pytest -m "not slow"

lint: setup
	$(BIN)/ruff check sopgraph tests benchmarks

mutate: setup
	$(BIN)/python .ci/mutate.py

bench: setup
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) out
