# The two commands a newcomer runs: `make demo` and `make test`.
# Both set up everything they need (a virtualenv, the Kafka jars) on first use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: install kafka-jars demo test lint format clean

$(INSTALLED): pyproject.toml
	@echo "==> creating $(VENV) and installing the project with its test extras"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $@

install: $(INSTALLED)

kafka-jars: install
	$(BIN)/outbox dev kafka fetch

demo: kafka-jars
	$(BIN)/outbox demo

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: kafka-jars lint
	$(BIN)/pytest

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
