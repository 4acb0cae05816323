# The two commands a newcomer runs: `make demo` and `make test`.
# Both set up everything they need (a virtualenv, the Kafka jars) on first use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: install kafka-jars demo chaos test lint format clean bench bench-producer bench-checker spark-jars bench-sink bench-parking bench-peer model docs test-cluster test-long test-durations image

# The library with its test extras, and next to it the developer tooling
# (devtools/: local runtimes, demo, chaos, pytest plugin), which is not in the
# library's wheel and adds its sub-commands to `outbox`.
$(INSTALLED): pyproject.toml devtools/pyproject.toml
	@echo "==> creating $(VENV) and installing the library and the developer tooling"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip 'setuptools>=77'
	$(BIN)/pip install --quiet -e '.[test]' -e ./devtools
	@touch $@

install: $(INSTALLED)

kafka-jars: install
	$(BIN)/outbox dev kafka fetch

# Spark's Kafka source (spark-sql-kafka-0-10) and Delta Lake for the sink, resolved with Maven once.
spark-jars: install
	$(BIN)/outbox dev spark fetch --delta

demo: kafka-jars spark-jars
	$(BIN)/outbox demo

# The pipeline under seeded faults; `make chaos SEED=N` reproduces a run,
# `make chaos SINK=delta` lands the events in a Delta table, `make chaos BROKERS=3`
# runs Kafka as a three-node cluster (rolling restart, leader and coordinator kills),
# `make chaos PARTITIONS=1` adds network partitions (as root: network namespaces),
# `make chaos PARK=1` parks sends while Kafka is away and kills Kafka for 20-30 s.
SEED ?= 1
SINK ?= parquet
BROKERS ?= 1
PARTITIONS ?=
PARK ?=
chaos: kafka-jars spark-jars
	$(BIN)/outbox chaos --seed $(SEED) --sink-format $(SINK) --brokers $(BROKERS) \
		$(if $(PARTITIONS),--network-partitions) $(if $(PARK),--park-when-unavailable)

# Every benchmark on one local broker: one table, bench/results/all.json.
bench: kafka-jars spark-jars
	$(BIN)/python -m bench.all $(BENCH_ARGS)

bench-producer: kafka-jars
	$(BIN)/python -m bench.producer

bench-checker: kafka-jars
	$(BIN)/python -m bench.checker

bench-sink: kafka-jars spark-jars
	$(BIN)/python -m bench.sink

# Send latency across a broker freeze, without and with parking, on a broker of its own.
bench-parking: kafka-jars
	$(BIN)/python -m bench.parking $(BENCH_ARGS)

# Us against faststream-outbox, a polling outbox: the same service on a local PostgreSQL
# and broker; requests/s, CPU a request, commit-to-visible, the database's cost.
bench-peer: kafka-jars
	$(BIN)/python -m bench.peer $(BENCH_ARGS)

# The Hypothesis models, far longer than the suite's short runs: the protocol (tests/model)
# and the ways services use SQLAlchemy sessions around joined sends (real broker and databases).
MODEL_EXAMPLES ?= 5000
model: kafka-jars
	OUTBOX_MODEL_EXAMPLES=$(MODEL_EXAMPLES) $(BIN)/pytest tests/model tests/sql/test_session_usage_model.py -q --timeout=3600 --hypothesis-show-statistics

# The documentation site (docs/, mkdocs.yml) into site/; `$(BIN)/mkdocs serve` to read it live.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Three pytest workers (pytest-xdist), a test file per worker at a time, the longest
# measured files first (tests/scheduling.py): most tests wait on brokers, sessions and
# timers, so three beat two on this 2-core machine: 18.4-22.6 min from a fresh clone in
# four runs against 26-31 min for two (2026-12-02). Under that load six three-worker runs
# failed a test of real timing, each on a latent defect, fixed once found.
# `make test TEST_WORKERS=2` for a busier machine; TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= 3
# Run in a TMPDIR of its own (outbox_devtools/leftovers.py): a process or directory the
# suite leaves behind is named and fails the run.
test: kafka-jars spark-jars lint
	$(BIN)/python -m outbox_devtools.leftovers -- \
		$(BIN)/pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# The suite as `make test` runs it, writing each file's measured time to
# tests/file_durations.json (the scheduler's order); refresh it when a file's time moves.
test-durations: kafka-jars spark-jars
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --store-file-durations

# Longer variants of proofs whose shorter variant runs in `make test`.
test-long: kafka-jars spark-jars
	$(BIN)/pytest -m long_proof

# The three-node failover proofs alone (they run in `make test` too).
test-cluster: kafka-jars spark-jars
	$(BIN)/pytest -m cluster_proof

# The checker sidecar's and the sink's images (Dockerfile targets `checker` and `sink`),
# tagged kafka-outbox-checker:<version> and kafka-outbox-sink:<version>: docker build
# where a Docker engine answers, else buildah (daemonless) on a Debian bookworm base
# made with debootstrap; buildah and debootstrap are installed from Debian if missing.
# Needs no virtualenv (outbox_devtools/images.py is standard library only).
# `make image IMAGE_TARGETS=checker` builds one; docs/operations.md#container-images.
IMAGE_TARGETS ?= checker sink
image:
	PYTHONPATH=devtools $(PYTHON) -m outbox_devtools.images build $(foreach t,$(IMAGE_TARGETS),--target $(t))

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info devtools/*.egg-info site
