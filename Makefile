# One entry point for people and CI. `make test` and `make run` are the README's two commands.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev

.PHONY: install test lint typecheck unit run bench-log clean

# (Re)install when pyproject.toml changes; a missing venv is created first.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(STAMP)

lint: install
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest $(PYTEST_ARGS)

test: lint typecheck unit

run:
	@echo "make run will start a standalone liftlog server with embedded NATS and data under ./data."
	@echo "The server arrives with the next milestone (issue 3); for now run 'make test' or 'make bench-log'."
	@exit 2

bench-log: install
	$(BIN)/python bench/log_bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis src/*.egg-info
