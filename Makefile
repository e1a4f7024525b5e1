# Two entry points, each a single command on a fresh machine with Python 3.11:
#   make demo   — set up (venv, package, graphviz, fonts) and run the offline demo
#   make test   — set up (plus test tools, chromium, Ray) and run the test suite but its slowest tests
#   (make test-slow runs those, make test-all both; CI runs both)
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: setup demo test test-slow test-all lint bench mutate clean

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
	$(BIN)/python -m pytest -m "not slow"

# the slowest tests (tests/slow_tests.txt and @pytest.mark.slow: subprocess runs, kills and resumes, a Ray
# cluster, fuzzing); CI runs them after `make test`
test-slow: setup
	bash .ci/system-deps chromium fonts-liberation fonts-wqy-microhei
	$(BIN)/python -m pytest -m slow

test-all: test test-slow

lint: setup
	$(BIN)/ruff check sopgraph tests benchmarks

mutate: setup
	$(BIN)/python .ci/mutate.py

bench: setup
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) out
