# pyspark-kafka-share: `make demo` and `make test` each set up what they need (idempotent).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
PYTEST_ARGS ?=
QUICK ?=
BENCH_ARGS ?=
JOURNAL ?=# make demo JOURNAL=s3: the demo's journal on a local S3 server (LocalS3)

.PHONY: demo demo-workers test test-cluster unit lint typecheck jars bench clean help

help:
	@echo "make demo   - run the kafka-share pipeline on an embedded Kafka broker"
	@echo "make demo-workers - queue workers scoring records (ACCEPT/RELEASE/REJECT, DLQ)"
	@echo "make test   - lint, type-check and run all tests (real broker, local Spark)"
	@echo "make test-cluster - the cluster tier: a Spark standalone cluster on loopback"
	@echo "make unit   - pure unit tests only (no broker, no Spark)"
	@echo "make bench  - benchmark (~14 min; QUICK=1: ~4 min) -> docs/benchmarks/"

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

jars: $(STAMP)
	$(VENV)/bin/kafka-share fetch-jars

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $(BENCH_STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests demo $(wildcard bench)

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(PY) -m pytest -m "not broker and not spark" $(PYTEST_ARGS)

test: $(STAMP) lint typecheck jars
	$(PY) -m pytest $(PYTEST_ARGS)

# The cluster tier: a Spark standalone master and two workers (tests/cluster, marker
# "cluster"), in a pytest process of its own; its summary shows what Spark really did.
test-cluster: $(STAMP) jars
	$(PY) -m pytest -m cluster tests/cluster $(PYTEST_ARGS)

demo: $(STAMP) jars
	$(PY) demo/demo.py $(if $(JOURNAL),--journal $(JOURNAL))

# make bench QUICK=1 for the quick mode; BENCH_ARGS="--only share-*,kafka --rounds 1" etc.
bench: $(BENCH_STAMP) jars
	$(PY) bench/_jars.py >/dev/null
	$(PY) bench/run.py $(if $(filter-out 0 no false,$(QUICK)),--quick) $(BENCH_ARGS)
	$(PY) bench/journal_slot.py

demo-workers: $(STAMP) jars
	$(PY) demo/workers_demo.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist
