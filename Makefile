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

# The version tiers (docs/compatibility.md, "Why the diagonal loses nothing"). A pair
# <pyspark>:<kafka> runs one pytest process on that PySpark line's venv (.venv-spark-<pyspark>;
# "main": .venv, the newest) against a session broker of that Apache Kafka line
# (PYSPARK_KAFKA_SHARE_KAFKA_VERSION selects the broker the fixtures start). The Spark line and
# the Kafka line do not meet (Spark never talks to the broker; the source and the workers reach
# it through confluent-kafka and the protocol client, the same code on every Spark line), so CI
# runs a diagonal (make test-versions): each older PySpark line with an older Kafka line, the
# union of both subsets. make test covers the newest pair (PySpark 4.3, Kafka 4.4).
VERSION_PAIRS ?= 4.0.5:4.2.2 4.1.4:4.3.1

# The older PySpark lines (make test-spark-lines: the Spark subset on each, against the newest
# Kafka), each venv with the delta-spark release that fits the line (DELTA_<major.minor>; none:
# no Delta test).
SPARK_LINES ?= 4.0.5 4.1.4
SPARK_OLDEST ?= $(firstword $(SPARK_LINES))
DELTA_4.0 ?= 4.0.1
DELTA_4.1 ?= 4.4.0
# The Spark subset: the source exactly-once through failures, workers, the docs' progress
# recipe, the AvailableNow warning, an unreachable broker failing load() within 5 s, the
# Delta Lake example and the cheapest RENEW test (also in the Kafka subset: RENEW is a broker
# matter, and the 4.3.1 pair runs only this subset). What no Spark line changes runs in make test only: admin (no Spark) and
# the journal's store and fsync variants (one local, fsynced journal here).
# The tiers select by pytest markers (pyproject.toml; a test carries the subsets it is in, so a
# renamed test stays in its tiers); tests/tiers/ records each tier's selection and
# tests/unit/test_tiers.py (make test) fails if a tier stops selecting a recorded test.
# journal_variant: a journal cell but local-offsets (another store or content); client_variant: a
# source test's cell on librdkafka, the client other than the source's default (make test only, for
# CI's minutes).
OLDEST_TESTS := tests/integration/test_spark_versions.py tests/integration/test_source.py \
	tests/integration/test_workers.py tests/integration/test_progress_lines.py \
	tests/integration/test_delta.py tests/integration/test_workers_renew.py
OLDEST_M ?= spark_subset and not journal_variant and not client_variant
# make demo SINK=delta: the Delta Lake example, on this line's venv (Delta has no Spark 4.3).
DELTA_LINE ?= 4.1.4
SINK ?=

# The oldest and the newest Apache Kafka line (make test-kafka-versions: the Kafka subset on
# each of KAFKA_TIER_LINES with the newest PySpark; docs/compatibility.md). The newest is the
# harness's default broker, so make test runs everything on it.
KAFKA_OLDEST ?= 4.2.2
KAFKA_NEWEST ?= 4.4.0
KAFKA_TIER_LINES ?= $(KAFKA_OLDEST)
# The Kafka subset: the source exactly-once through failures, the workers with their
# dead-letter topic, admin and every CLI command, lag, test_kafka_versions.py, the cheapest
# RENEW test (the native client's workers, a 5 s lock). The journal on
# S3 is no broker matter: its variants are left out.
KAFKA_VERSIONS_TESTS := tests/integration/test_kafka_versions.py tests/integration/test_source.py \
	tests/integration/test_workers.py tests/integration/test_admin.py tests/integration/test_cli.py \
	tests/integration/test_workers_renew.py
KAFKA_VERSIONS_M ?= kafka_subset and not journal_variant and not client_variant
# Tests of what Kafka 4.2 lacks (marker needs_kafka_4_3): a group's own
# share.delivery.count.limit (4.3+; on 4.2 the broker's applies: test_kafka_versions.py checks
# that instead). Left out on every 4.2 line.

# Tests of the Kafka subset that need Spark 4.2+ (marker needs_spark_4_2: a Trigger.AvailableNow
# run that drains; 4.0 and 4.1 run one micro-batch): left out on the 4.0 and 4.1 pairs, run with
# the newest PySpark on KAFKA_OLDEST together with the rolling upgrade from KAFKA_OLDEST to
# KAFKA_NEWEST (marker kafka_upgrade, a broker of its own). A pair's process is time-boxed
# (seconds): SIGINT (pytest tears down), then KILL. Measured on the loaded 2-core machine:
# docs/compatibility.md.
VERSIONS_TIMEOUT ?= 1200
SPARK_LINE_TIMEOUT ?= 900
KAFKA_VERSIONS_TIMEOUT ?= 720

# $(call run_pairs,<pairs>,<test files>,<-m expression>,<timeout s>): one pytest process a pair.
define run_pairs
	set -e; for pair in $(1); do \
		s=$${pair%%:*}; k=$${pair##*:}; py=.venv-spark-$$s/bin/python; \
		if [ "$$s" = main ]; then py=$(PY); fi; \
		only43=""; case $$k in 4.2.*) only43=" and not needs_kafka_4_3";; esac; \
		only42=""; case $$s in 4.0.*|4.1.*) only42=" and not needs_spark_4_2";; esac; \
		upgrade=" and not kafka_upgrade"; \
		if [ "$$s:$$k" = "main:$(KAFKA_OLDEST)" ]; then upgrade=""; fi; \
		echo "== PySpark $$s, Apache Kafka $$k"; \
		PYSPARK_KAFKA_SHARE_KAFKA_VERSION=$$k $(VENV)/bin/kafka-share fetch-jars; \
		PYSPARK_KAFKA_SHARE_KAFKA_VERSION=$$k KAFKA_UPGRADE_FROM=$(KAFKA_OLDEST) \
			KAFKA_UPGRADE_TO=$(KAFKA_NEWEST) timeout -s INT -k 60 $(4) $$py -m pytest $(2) \
			-m "($(3))$$upgrade$$only43$$only42" $(PYTEST_ARGS); \
	done
endef
venvs_of = $(foreach s,$(filter-out main,$(foreach p,$(1),$(firstword $(subst :, ,$(p))))),\
	.venv-spark-$(s)/.installed)

.PHONY: ci-deps test-brokers-ci-if-go demo demo-workers demo-delta docs docs-serve test test-cluster test-brokers test-brokers-ci chaos-scale chaos-scale-ci chaos-scale-ci-if-go toxiproxy promtool promtool-if-go test-versions test-spark-lines test-spark-oldest test-kafka-versions test-connect chaos chaos-long unit lint typecheck jars bench bench-journal clean help

help:
	@echo "make demo   - run the kafka-share pipeline on an embedded Kafka broker"
	@echo "make demo SINK=delta - kafka-share -> from_json -> Delta Lake (PySpark $(DELTA_LINE))"
	@echo "make demo-workers - queue workers scoring records (ACCEPT/RELEASE/REJECT, DLQ)"
	@echo "make test   - lint, type-check and run all tests (real broker, local Spark)"
	@echo "make test-cluster - the cluster tier: a Spark standalone cluster on loopback"
	@echo "make test-versions - the version tiers (CI): PySpark:Kafka pairs $(VERSION_PAIRS)"
	@echo "make test-spark-lines - the Spark subset on PySpark $(SPARK_LINES) (a venv each)"
	@echo "make test-kafka-versions - the Kafka subset on Kafka $(KAFKA_TIER_LINES), an upgrade to $(KAFKA_NEWEST)"
	@echo "make test-connect - the Connect tier: the source and the workers from a Spark Connect client"
	@echo "make test-brokers - a three-broker cluster under broker kills and network faults"
	@echo "make test-brokers-ci - the brokers tier's short CI subset (~4 min)"
	@echo "make chaos-scale - 1,000,000 records, 100 faults, an upgrade, on three brokers (~65 min)"
	@echo "make chaos-scale-ci - its short seeded version (CI: 3,000 records, 8 faults, ~4 min)"
	@echo "make chaos  - faults on a seeded schedule against a steady stream (~8 min; CHAOS_SEED=)"
	@echo "make chaos-long - the same with 100,000+ records and 24 faults (~11 min)"
	@echo "make unit   - pure unit tests only (no broker, no Spark)"
	@echo "make docs   - build the docs site into site/ (strict); make docs-serve: serve it"
	@echo "make bench  - benchmark (~30 min; QUICK=1: ~6 min) -> docs/benchmarks/"
	@echo "make bench-journal - the journal's S3 requests in a real run, beside Spark's kafka source"

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
	$(VENV)/bin/ruff check src tests demo $(wildcard bench) mkdocs_hooks.py

# The docs site from docs/ (mkdocs.yml): strict, so a broken link or API reference fails the
# build (make test runs it with the lint); docs-serve serves it on http://127.0.0.1:8000.
# NO_MKDOCS_2_WARNING: mkdocs-material's banner about its successor (its end of life is
# announced for 2027-05-05), printed on every build.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

# mypy --strict on src, tests and the docs site's hooks (the files in pyproject.toml's
# [tool.mypy]).
typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP)
	$(PY) -m pytest -m "not broker and not spark" $(PYTEST_ARGS)

test: $(STAMP) lint typecheck docs jars
	$(PY) -m pytest --durations=30 $(PYTEST_ARGS)

# The cluster tier: a Spark standalone master and two workers (tests/cluster, marker
# "cluster"), in a pytest process of its own; its summary shows what Spark really did.
test-cluster: $(STAMP) jars
	$(PY) -m pytest -m cluster tests/cluster $(PYTEST_ARGS)

# Toxiproxy (Shopify's TCP fault proxy) for the brokers tier: one Go binary, built once from
# the Go module proxy into the harness's cache (harness/toxiproxy.py finds it there). v2.5.0 is
# the newest v2 the proxy serves for this module path.
TOXIPROXY_VERSION ?= v2.5.0
CACHE_DIR := $(or $(PYSPARK_KAFKA_SHARE_CACHE),$(XDG_CACHE_HOME:%=%/pyspark-kafka-share),$(HOME)/.cache/pyspark-kafka-share)
TOXIPROXY := $(CACHE_DIR)/toxiproxy-$(TOXIPROXY_VERSION)/server
$(TOXIPROXY):
	mkdir -p $(dir $@)
	GOBIN=$(abspath $(dir $@)) go install github.com/Shopify/toxiproxy/v2/cmd/server@$(TOXIPROXY_VERSION)
toxiproxy: $(TOXIPROXY)

# promtool (Prometheus' rule checker) for tests/unit/test_monitoring.py's `promtool check
# rules` / `promtool test rules` of deploy/monitoring/: one Go binary, built once from the Go
# module proxy into the cache (the test finds it there; without it those two cases skip).
# Prometheus 3.x is published to the proxy as v0.3xx.y (its v3 tags are not a /v3 module).
PROMTOOL_VERSION ?= v0.316.0
PROMTOOL := $(CACHE_DIR)/promtool-$(PROMTOOL_VERSION)/promtool
$(PROMTOOL):
	mkdir -p $(dir $@)
	GOFLAGS=-mod=mod GOBIN=$(abspath $(dir $@)) go install github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION)
promtool: $(PROMTOOL)
# Not built by make test: the build took 1,119 s on the shared 2-core machine (load 25-39,
# the Go module cache warm), more than CI's budget has room for; `make promtool` once, then
# make test runs the two promtool cases. promtool-if-go: the build when Go is installed, a
# failure or a build over 30 min leaving the two cases skipped (they say why).
promtool-if-go:
	@if ! command -v go >/dev/null 2>&1; then echo "make: no Go: the promtool checks of tests/unit/test_monitoring.py skip"; \
	elif ! timeout 1800 $(MAKE) --no-print-directory promtool; then echo "make: promtool did not build: the promtool checks of tests/unit/test_monitoring.py skip"; fi

# The brokers tier (tests/brokers, marker "brokers", a pytest process of its own): a
# three-broker KRaft cluster, a Toxiproxy proxy in front of each node's client listener, and
# the source and the workers through broker kills and network faults; time-boxed (seconds):
# SIGINT (pytest tears the cluster down), then KILL. 1800 s (was 900): the tier gained the
# network-fault, SIGSTOP, store-outage and SASL_SSL tests; the store-outage test alone waits
# for the journal's retry bound (see docs/deployment.md for the measured minutes). 2400 s
# (was 1800): the workers' coordinator kill and leader moves also run with the native client
# (three more runs, about 6 minutes measured).
BROKERS_TIMEOUT ?= 2400
test-brokers: $(STAMP) jars $(TOXIPROXY)
	timeout -s INT -k 60 $(BROKERS_TIMEOUT) $(PY) -m pytest -m "brokers and not chaos_scale" \
		tests/brokers $(PYTEST_ARGS)

# The brokers tier's short CI subset (marker "brokers_ci"): the tests covering the most
# distinct failures (docs/deployment.md lists them and their minutes: about 5:45 at load
# average 13-25 on 2 cores, hence 480 s).
BROKERS_CI_TIMEOUT ?= 480
CHAOS_SCALE_CI_TIMEOUT ?= 600
# What .ci/run's lanes share, installed once before they start in parallel: the venv, the
# broker's jars, the version tiers' venvs (Toxiproxy is built in lane 2, which uses it alone).
ci-deps: $(STAMP) jars $(call venvs_of,$(VERSION_PAIRS))

# .ci/run's lane 2: the three-broker CI subset when Toxiproxy can be had (built before, or Go
# installed to build it); without either it says so and passes, as promtool-if-go does.
test-brokers-ci-if-go:
	@if [ -x $(TOXIPROXY) ] || command -v go >/dev/null 2>&1; then \
		$(MAKE) --no-print-directory test-brokers-ci; \
	else echo "make: no Go to build Toxiproxy: the three-broker CI subset (make test-brokers-ci) did not run"; fi

test-brokers-ci: $(STAMP) jars $(TOXIPROXY)
	timeout -s INT -k 60 $(BROKERS_CI_TIMEOUT) $(PY) -m pytest -m brokers_ci tests/brokers \
		$(PYTEST_ARGS)

# CI's short seeded chaos-scale (lane 2 of .ci/run, time-boxed at CHAOS_SCALE_CI_TIMEOUT s):
# the source's test of make chaos-scale at 3,000 records and 8 faults 12 s apart, on a
# cluster started on KAFKA_OLDEST and upgraded to KAFKA_NEWEST halfway, the query switching
# share client at every start; a random seed, printed (CHAOS_SEED=<seed> replays it).
# Measured 184 s for 7 faults on the loaded 2-core machine.
chaos-scale-ci-if-go:
	@if [ -x $(TOXIPROXY) ] || command -v go >/dev/null 2>&1; then \
		$(MAKE) --no-print-directory chaos-scale-ci; \
	else echo "make: no Go to build Toxiproxy: the short chaos-scale (make chaos-scale-ci) did not run"; fi

chaos-scale-ci: $(STAMP) jars $(TOXIPROXY)
	CHAOS_RECORDS=$${CHAOS_RECORDS:-3000} CHAOS_FAULTS=$${CHAOS_FAULTS:-8} \
		CHAOS_INTERVAL_S=$${CHAOS_INTERVAL_S:-12} \
		PYSPARK_KAFKA_SHARE_KAFKA_VERSION=$(KAFKA_OLDEST) CHAOS_UPGRADE_TO=$(KAFKA_NEWEST) \
		timeout -s INT -k 60 $(CHAOS_SCALE_CI_TIMEOUT) $(PY) -m pytest -m chaos_scale \
		tests/brokers -k every_record_lands $(PYTEST_ARGS)

# The long seeded chaos run on the three-broker cluster (marker "chaos_scale", not in CI):
# the source under 1,000,000 records and 100 faults 25 s apart (node crashes, leader moves,
# latency, resets, blackholes, slow drips, Python worker kills and exits, query restarts, a
# task past its lock) and a rolling upgrade from KAFKA_OLDEST to KAFKA_NEWEST halfway
# (CHAOS_UPGRADE_TO= for none), the query switching share client at every start; then the
# queue workers, 50,000 records and 15 faults a run, once per client on the upgraded cluster
# and once on a SASL_SSL cluster. CHAOS_SEED=<seed> replays (tests/brokers/chaos_scale.py,
# docs/guarantees.md); CHAOS_CLIENT pins one client. Spark runs as a standalone cluster (two
# workers, one executor each) with executor kills in the schedules (CHAOS_SPARK=local for
# local[2, 4] without them). Measured: 65 min 12 s with the cluster, 64 min 42 s local
# (2026-11-28).
chaos-scale: $(STAMP) jars $(TOXIPROXY)
	CHAOS_RECORDS=$${CHAOS_RECORDS:-1000000} CHAOS_FAULTS=$${CHAOS_FAULTS:-100} \
		CHAOS_INTERVAL_S=$${CHAOS_INTERVAL_S:-25} \
		CHAOS_WORKER_RECORDS=$${CHAOS_WORKER_RECORDS:-50000} \
		CHAOS_WORKER_FAULTS=$${CHAOS_WORKER_FAULTS:-15} \
		PYSPARK_KAFKA_SHARE_KAFKA_VERSION=$${PYSPARK_KAFKA_SHARE_KAFKA_VERSION:-$(KAFKA_OLDEST)} \
		CHAOS_UPGRADE_TO=$${CHAOS_UPGRADE_TO-$(KAFKA_NEWEST)} \
		CHAOS_SPARK=$${CHAOS_SPARK:-cluster} \
		$(PY) -m pytest -m chaos_scale tests/brokers $(PYTEST_ARGS)

# The Connect tier (tests/connect, marker "connect", a pytest process of its own): a local
# Spark Connect server (a JVM of its own, from pyspark's jars) and a Connect client session;
# time-boxed (seconds): SIGINT (pytest tears the server down), then KILL. Measured 3.5 min for
# the source and workers tests together on 2 cores shared with four other test runs; 1 min
# 50 s on an idle machine. 720 (was 420): the metrics tests (test_connect_metrics.py) added
# 172 s measured under a load of 20-39.
CONNECT_TIMEOUT ?= 720
test-connect: $(STAMP) jars
	timeout -s INT -k 60 $(CONNECT_TIMEOUT) $(PY) -m pytest -m connect tests/connect $(PYTEST_ARGS)

# The chaos test (tests/chaos, marker "chaos", a pytest process of its own): a steady producer,
# an exactly-once query and a seeded schedule of faults. CHAOS_SEED=<seed> replays a schedule;
# CHAOS_RECORDS, CHAOS_FAULTS, CHAOS_INTERVAL_S size it (tests/chaos/chaos_schedule.py); each
# test (the source's, the workers') runs once per share client (CHAOS_CLIENT=native or
# librdkafka: that one only).
chaos: $(STAMP) jars
	$(PY) -m pytest -m chaos tests/chaos $(PYTEST_ARGS)

chaos-long: $(STAMP) jars
	CHAOS_RECORDS=$${CHAOS_RECORDS:-100000} CHAOS_FAULTS=$${CHAOS_FAULTS:-24} \
		$(PY) -m pytest -m chaos tests/chaos $(PYTEST_ARGS)

# .venv-spark-<version>: that PySpark, the package (editable) and the fitting delta-spark.
.venv-spark-%/.installed: pyproject.toml
	test -x .venv-spark-$*/bin/python || $(PYTHON) -m venv .venv-spark-$*
	.venv-spark-$*/bin/python -m pip install -q --upgrade pip
	.venv-spark-$*/bin/python -m pip install -q -e '.[dev]' 'pyspark==$*' \
		$(if $(DELTA_$(basename $*)),'delta-spark==$(DELTA_$(basename $*))')
	touch $@

# CI's version tiers: the union of the Spark and the Kafka subsets on each pair; then, with the
# newest PySpark on KAFKA_OLDEST, the Kafka subset's needs_spark_4_2 tests and the rolling
# upgrade (kafka_subset: the source's exact-maxRecordsPerTrigger test on the native client, a
# needs_spark_4_2 test of make test alone, stays out since that client became the default).
# CI's time (60 min in all): the first pair (the oldest of both) runs the union of the subsets
# but the Delta example, the other pairs the Spark subset with it (delta-spark of the 4.1 line,
# the demo's; make test-spark-line-4.0.5 runs Delta 4.0.1).
test-versions: $(STAMP) $(call venvs_of,$(VERSION_PAIRS))
	$(call run_pairs,$(firstword $(VERSION_PAIRS)),$(sort $(OLDEST_TESTS) $(KAFKA_VERSIONS_TESTS)),\
		(($(OLDEST_M)) and not delta) or ($(KAFKA_VERSIONS_M)),$(VERSIONS_TIMEOUT))
	$(call run_pairs,$(wordlist 2,99,$(VERSION_PAIRS)),$(OLDEST_TESTS),$(OLDEST_M),\
		$(VERSIONS_TIMEOUT))
	$(call run_pairs,main:$(KAFKA_OLDEST),$(KAFKA_VERSIONS_TESTS),\
		kafka_upgrade or (needs_spark_4_2 and kafka_subset and not journal_variant and not client_variant),\
		$(KAFKA_VERSIONS_TIMEOUT))

# Developer targets: one subset on one axis, the other axis at its newest.
# make test-spark-line-4.0.5: the Spark subset on that line, against the newest Kafka.
test-spark-line-%: .venv-spark-%/.installed $(STAMP)
	$(call run_pairs,$*:$(KAFKA_NEWEST),$(OLDEST_TESTS),$(OLDEST_M),$(SPARK_LINE_TIMEOUT))

test-spark-lines: $(addprefix test-spark-line-,$(SPARK_LINES))

test-spark-oldest: test-spark-line-$(SPARK_OLDEST)

# The Kafka subset on each of KAFKA_TIER_LINES with the newest PySpark (.venv); the run on
# KAFKA_OLDEST adds the rolling upgrade (one pytest process a line). KAFKA_TIER_LINES="4.2.2 4.3.1 4.4.0": every line.
test-kafka-versions: $(STAMP)
	$(call run_pairs,$(addprefix main:,$(KAFKA_TIER_LINES)),\
		$(KAFKA_VERSIONS_TESTS),$(KAFKA_VERSIONS_M),$(KAFKA_VERSIONS_TIMEOUT))

.PRECIOUS: .venv-spark-%/.installed

demo-delta: .venv-spark-$(DELTA_LINE)/.installed jars
	.venv-spark-$(DELTA_LINE)/bin/python demo/delta_pipeline.py

ifeq ($(SINK),delta)
demo: demo-delta
else
demo: $(STAMP) jars
	$(PY) demo/demo.py $(if $(JOURNAL),--journal $(JOURNAL))
endif

# make bench QUICK=1 for the quick mode; BENCH_ARGS="--only share-*,kafka --rounds 1" etc.
bench: $(BENCH_STAMP) jars
	$(PY) bench/_jars.py >/dev/null
	$(PY) bench/run.py $(if $(filter-out 0 no false,$(QUICK)),--quick) $(BENCH_ARGS)
	$(PY) bench/journal_slot.py
	$(PY) bench/workers_eos.py --out docs/benchmarks/workers_eos.json  # exactly-once outputs' cost
	$(PY) bench/workers_concurrency.py --out docs/benchmarks/workers_concurrency.json --plot docs/benchmarks/workers_concurrency.png  # calls in flight
	$(MAKE) bench-journal

# The journal's requests in a real run (bench/journal_real.py): a paced stream at each of
# JOURNAL_RATES records/s, kafka-share with JOURNAL_TASKS tasks, its journal on the local S3
# server (and both queries' checkpoints through s3a), beside Spark's kafka source; every
# request counted from the server's log. About 2.5 min per case (JOURNAL_SECONDS counted after
# a 60 s warm-up). The first run fetches hadoop-aws and the AWS SDK bundle (~690 MB) once.
JOURNAL_RATES ?= 1000,10000
JOURNAL_TASKS ?= 8,32
JOURNAL_SECONDS ?= 60
bench-journal: $(BENCH_STAMP) jars
	$(PY) bench/journal_real.py --rates $(JOURNAL_RATES) --tasks $(JOURNAL_TASKS) \
		--seconds $(JOURNAL_SECONDS) --out docs/benchmarks/journal_real.json

demo-workers: $(STAMP) jars
	$(PY) demo/workers_demo.py

clean:
	rm -rf $(VENV) .venv-spark-* .pytest_cache .mypy_cache .ruff_cache build dist
