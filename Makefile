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

# The oldest supported PySpark line, in a venv of its own (make test-spark-oldest).
SPARK_OLDEST ?= 4.0.5
VENV_OLDEST := .venv-spark-oldest
# The end-to-end subset run there: the source exactly-once through failures, workers, admin.
OLDEST_TESTS := tests/integration/test_spark_versions.py tests/integration/test_source.py \
	tests/integration/test_workers.py tests/integration/test_admin.py
OLDEST_K ?= more_tasks_than_partitions or worker_killed_after_publish or failed_task_attempt \
	or query_stopped_mid_batch or bad_input_fails_at_load or max_records_per_trigger_caps \
	or outcomes_dead_letters or batch_form_with_pandas or killed_worker_loses_nothing \
	or lag_after_accepting or reset_to_earliest

.PHONY: demo demo-workers test test-cluster test-spark-oldest chaos chaos-long unit lint typecheck jars bench clean help

help:
	@echo "make demo   - run the kafka-share pipeline on an embedded Kafka broker"
	@echo "make demo-workers - queue workers scoring records (ACCEPT/RELEASE/REJECT, DLQ)"
	@echo "make test   - lint, type-check and run all tests (real broker, local Spark)"
	@echo "make test-cluster - the cluster tier: a Spark standalone cluster on loopback"
	@echo "make test-spark-oldest - an end-to-end subset on PySpark $(SPARK_OLDEST) (own venv)"
	@echo "make chaos  - faults on a seeded schedule against a steady stream (~5 min; CHAOS_SEED=)"
	@echo "make chaos-long - the same with 100,000+ records and 24 faults (~15 min)"
	@echo "make unit   - pure unit tests only (no broker, no Spark)"
	@echo "make bench  - benchmark (~35 min; QUICK=1: ~6 min) -> docs/benchmarks/"

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

# mypy --strict on src and tests (the files in pyproject.toml's [tool.mypy]).
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

# The chaos test (tests/chaos, marker "chaos", a pytest process of its own): a steady producer,
# an exactly-once query and a seeded schedule of faults. CHAOS_SEED=<seed> replays a schedule;
# CHAOS_RECORDS, CHAOS_FAULTS, CHAOS_INTERVAL_S size it (tests/chaos/chaos_schedule.py).
chaos: $(STAMP) jars
	$(PY) -m pytest -m chaos tests/chaos $(PYTEST_ARGS)

chaos-long: $(STAMP) jars
	CHAOS_RECORDS=$${CHAOS_RECORDS:-100000} CHAOS_FAULTS=$${CHAOS_FAULTS:-24} \
		$(PY) -m pytest -m chaos tests/chaos $(PYTEST_ARGS)

$(VENV_OLDEST)/.installed-$(SPARK_OLDEST): pyproject.toml
	test -x $(VENV_OLDEST)/bin/python || $(PYTHON) -m venv $(VENV_OLDEST)
	$(VENV_OLDEST)/bin/python -m pip install -q --upgrade pip
	$(VENV_OLDEST)/bin/python -m pip install -q -e '.[dev]' 'pyspark==$(SPARK_OLDEST)'
	touch $@

test-spark-oldest: $(VENV_OLDEST)/.installed-$(SPARK_OLDEST) jars
	$(VENV_OLDEST)/bin/python -m pytest $(OLDEST_TESTS) -k "$(OLDEST_K)" $(PYTEST_ARGS)

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
	rm -rf $(VENV) $(VENV_OLDEST) .pytest_cache .mypy_cache .ruff_cache build dist
