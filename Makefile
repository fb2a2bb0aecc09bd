# One entry point for people and CI. `make test` and `make run` are the README's two commands.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
BASE_STAMP := $(VENV)/.installed-base

.PHONY: install install-base test lint typecheck unit run bench bench-log bench-spark bench-reassign sim chaos fuzz clean

# (Re)install when pyproject.toml changes; a missing venv is created first. `make run` needs the server
# only (the base package, about 100 MB); everything else also wants the test, Spark and plot extras.
$(BASE_STAMP): pyproject.toml
	@echo "installing liftlog into $(VENV)" >&2
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --upgrade pip >&2
	@$(BIN)/python -m pip install --quiet -e . >&2
	@touch $@

$(STAMP): pyproject.toml
	@echo "installing liftlog with its dev, spark and plot extras into $(VENV)" >&2
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --quiet --upgrade pip >&2
	@$(BIN)/python -m pip install --quiet -e '.[dev,spark,plot]' >&2
	@touch $@ $(BASE_STAMP)

install-base: $(BASE_STAMP)

install: $(STAMP)

lint: install
	$(BIN)/ruff check src tests bench deploy
	$(BIN)/ruff format --check src tests bench deploy

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest $(PYTEST_ARGS)

test: lint typecheck unit

# A standalone server: embedded nats-server on 127.0.0.1:4222, gRPC API on 127.0.0.1:9292, data in ./data.
# Its server-to-server messages are signed with ./data/cluster.key, made on first run (docs/security.md);
# Prometheus metrics and health checks on http://127.0.0.1:9464 (/metrics, /healthz, /readyz).
run: install-base
	$(BIN)/liftlog server --embedded-nats --data-dir ./data --set clustering.auth.key.file=./data/cluster.key \
		--set clustering.auth.key.generate=true --set cursors.stream.partitions=1 \
		--set metrics.listen=127.0.0.1:9464 $(RUN_ARGS)

# Starts its own server (temporary data, free ports), once per fsync policy in BENCH_FSYNC, and compares them.
BENCH_FSYNC ?= never,interval,always
bench: install
	@$(BIN)/liftlog bench --start-server --fsync $(BENCH_FSYNC) $(BENCH_ARGS)

# The seeded simulations over many seeds: Raft alone, and the whole cluster (metadata, controller,
# replication, storage). CI runs their default counts (2,000 and 1,000) as part of `make test`.
SEEDS ?= 100000
sim: install
	LIFTLOG_SIM_SEEDS=$(SEEDS) LIFTLOG_CLUSTER_SIM_SEEDS=$(SEEDS) $(BIN)/pytest tests/sim -q --timeout 0

# Seeded random fault schedules against a 3-server cluster under load, then the checker: SEEDS=5 DURATION=30
# by default (seconds of faults per seed); SEED=<n> replays one seed; FSYNC=never|interval|always (default
# always); POWER_ALL=1 ends each seed with power loss of every server; KINDS=disk,power limits the faults;
# RETRY=1 resends every publish whose outcome is unknown, with its message id, and requires each id stored
# once. Exits 1 if an invariant failed.
chaos: install
	$(BIN)/python -m tests.chaos.run --seeds $(if $(filter file,$(origin SEEDS)),5,$(SEEDS)) \
		--duration $(or $(DURATION),30) $(if $(SEED),--seed $(SEED)) --fsync $(or $(FSYNC),always) \
		$(if $(POWER_ALL),--power-all) $(if $(KINDS),--kinds $(KINDS)) $(if $(RETRY),--retry)

# Benchmarks and fuzz print their JSON on stdout and nothing else (`make bench > x.json`).
# Fuzz a live server for DURATION seconds (default 60) with hostile gRPC requests and NATS messages, then
# check it is alive, its data unchanged and its memory bounded; SEED=<n> replays a run. One JSON line.
fuzz: install
	@$(BIN)/python -m tests.fuzz.live --duration $(or $(DURATION),60) $(if $(SEED),--seed $(SEED))

bench-log: install
	@$(BIN)/python bench/log_bench.py $(BENCH_ARGS)

# Spark reads (batch count and AvailableNow stream) of 1,000,000 256-byte messages vs our client's raw rate,
# and an exactly-once AvailableNow copy; each three times, the best counting (--runs N).
# Starts its own server unless BENCH_ARGS has --addr; one JSON line on stdout.
bench-spark: install
	@$(BIN)/python bench/spark_bench.py $(BENCH_ARGS)

# Moving a 1 GiB partition to another server of a 3-server cluster while a replicated stream takes
# ack-ALL publishes: the move's time and the live rate before and during it. One JSON line on stdout.
bench-reassign: install
	@$(BIN)/python bench/reassign_bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis src/*.egg-info
