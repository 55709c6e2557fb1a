"""Benchmark: kafka-share against the raw clients and Spark's built-in kafka source.

    python bench/run.py [--quick] [--records N] [--rounds R] [--only name,...] [--out DIR]

One embedded broker (LocalKafka) and one SparkSession (``local[8]``: 8 task slots, so that
numPartitions=8 runs 8 concurrent consumers) for the whole run. Datasets are produced once
before anything is measured; then R rounds each run every selected case once, in an order
rotated from round to round, and the medians are reported. See docs/benchmarks/README.md.

Raw results go to bench/out/; the published JSON, markdown table and PNG plots to --out
(default docs/benchmarks/, or bench/out/ when --only selects a subset).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

import _contenders as c  # noqa: E402
import _jars  # noqa: E402
import _machine  # noqa: E402
import _report  # noqa: E402

from pyspark_kafka_share.harness import LocalKafka, local_spark  # noqa: E402

MASTER = "local[8]"
SCALE_TASKS = (1, 2, 4, 8)
SCALE_TOPICS = (1, 4)


@dataclass(frozen=True)
class Sizes:
    """Dataset sizes and repetitions of one run mode."""

    mode: str
    records: int  # throughput suite, 4-partition topic
    partitions: int  # of the throughput topic; also the raw clients' thread count
    scale_records: int  # per scale-out topic (1 and 4 partitions), no per-record cost
    cost_records: int  # per scale-out topic with the per-record cost
    cost_ms: float  # the per-record cost (a sleep in mapInArrow)
    workers_ms: float  # the per-record cost of the queue workers' suite (on the cost topics)
    spread_records: int  # the spread suite's 1-partition topic (client="native", workers_ms)
    source_spread_records: int  # the spread suite's topic for the source (client="native")
    source_spread_ms: float  # the per-record cost after the source in its spread cases
    rounds: int
    latency_rate: int  # records/s of the paced producer
    latency_low_rate: int  # a second, lower rate (default options and the kafka source only)
    latency_seconds: float
    latency_warmup_s: float  # rows produced in the first seconds are not counted


# Full: about 30 min on 2 cores with make bench's other two scripts (2026-11-26; this script 25.7
# of them); quick: about 6 min (docs/benchmarks/README.md).
FULL = Sizes(mode="full", records=2_000_000, partitions=4, scale_records=300_000,
             cost_records=10_000, cost_ms=1.0, workers_ms=2.0, spread_records=40_000,
             source_spread_records=80_000, source_spread_ms=1.0, rounds=3,
             latency_rate=3_000, latency_low_rate=1_000, latency_seconds=25.0,
             latency_warmup_s=5.0)
QUICK = Sizes(mode="quick", records=200_000, partitions=4, scale_records=100_000,
              cost_records=4_000, cost_ms=1.0, workers_ms=2.0, spread_records=16_000,
              source_spread_records=24_000, source_spread_ms=1.0, rounds=1,
              latency_rate=2_000, latency_low_rate=1_000, latency_seconds=15.0,
              latency_warmup_s=3.0)


@dataclass(frozen=True)
class Case:
    """One contender configuration; ``run(round)`` measures it once."""

    suite: str
    name: str
    label: str
    dataset: str | None
    uses_spark: bool
    run: Callable[[int], c.Run]


class Bench:
    def __init__(self, sizes: Sizes, kafka: LocalKafka, tmp: Path) -> None:
        self.sizes = sizes
        self.kafka = kafka
        self.tmp = tmp
        self.data: dict[str, c.Dataset] = {}
        self.produced: dict[str, dict[str, Any]] = {}
        self.spark_bench: c.SparkBench | None = None

    # -- datasets ------------------------------------------------------------------------

    def dataset_specs(self) -> dict[str, tuple[int, int]]:
        s = self.sizes
        specs = {"main": (s.partitions, s.records)}
        for p in SCALE_TOPICS:
            specs[f"scale-p{p}"] = (p, s.scale_records)
            specs[f"cost-p{p}"] = (p, s.cost_records)
        specs["spread-p1"] = (1, s.spread_records)
        specs["spread-src-p1"] = (1, s.source_spread_records)
        return specs

    def produce(self, names: set[str]) -> None:
        for name, (partitions, records) in self.dataset_specs().items():
            if name not in names:
                continue
            data, info = c.produce_dataset(self.kafka, name, partitions, records)
            self.data[name] = data
            self.produced[name] = info
            log(f"produced {records:,} records to {data.topic} ({partitions} partitions) in "
                f"{info['produce_s']} s ({info['produce_records_per_s']:,.0f} records/s)")

    # -- cases ---------------------------------------------------------------------------

    def cases(self) -> list[Case]:
        s = self.sizes
        cases = [
            Case("throughput", "python-sync",
                 f"Python ShareConsumer x{s.partitions}, ACCEPT + commit_sync", "main", False,
                 lambda r: self._python(r, "sync")),
            Case("throughput", "python-async",
                 f"Python ShareConsumer x{s.partitions}, ACCEPT + commit_async", "main", False,
                 lambda r: self._python(r, "async")),
            Case("throughput", "java-perf",
                 f"Java ShareConsumerPerformance x{s.partitions} (implicit ack)", "main", False,
                 self._java),
            Case("throughput", "share-eo",
                 "kafka-share exactly-once (journal of offsets), client=librdkafka → noop",
                 "main", True,
                 lambda r: self._spark("throughput", "share-eo", r, "share-eo", "main")),
            Case("throughput", "share-eo-native",
                 "kafka-share exactly-once, client=native → noop", "main", True,
                 lambda r: self._spark("throughput", "share-eo-native", r, "share-eo-native",
                                       "main")),
            Case("throughput", "share-eo-records",
                 "kafka-share exactly-once, journalContent=records, client=librdkafka → noop",
                 "main", True,
                 lambda r: self._spark("throughput", "share-eo-records", r, "share-eo-records",
                                       "main")),
            Case("throughput", "share-eo-nofsync",
                 "kafka-share exactly-once, journalFsync=false, client=librdkafka → noop",
                 "main", True,
                 lambda r: self._spark("throughput", "share-eo-nofsync", r, "share-eo-nofsync",
                                       "main")),
            Case("throughput", "share-amo", "kafka-share at-most-once, client=librdkafka → noop",
                 "main", True,
                 lambda r: self._spark("throughput", "share-amo", r, "share-amo", "main")),
            Case("throughput", "kafka", "Spark kafka source → noop", "main", True,
                 lambda r: self._spark("throughput", "kafka", r, "kafka", "main")),
        ]
        for suite, cost in (("scale", 0.0), ("cost", s.cost_ms)):
            for p in SCALE_TOPICS:
                data = f"{suite}-p{p}"
                for n in SCALE_TASKS:
                    name = f"{suite}-p{p}-n{n}"
                    cases.append(Case(
                        suite, name, f"kafka-share exactly-once, {p}-partition topic, "
                        f"numPartitions={n}" + (f", {cost:g} ms/record" if cost else ""),
                        data, True, self._scale_runner(suite, name, data, n, cost)))
                name = f"{suite}-p{p}-kafka"
                cases.append(Case(
                    suite, name, f"Spark kafka source, {p}-partition topic ({p} tasks)"
                    + (f", {cost:g} ms/record" if cost else ""),
                    data, True, self._scale_runner(suite, name, data, None, cost)))
        for p in SCALE_TOPICS:
            for n in SCALE_TASKS:
                cases.append(Case(
                    "workers", f"workers-p{p}-w{n}", f"run_workers, {p}-partition topic, "
                    f"{n} workers, {s.workers_ms:g} ms/record", f"cost-p{p}", True,
                    self._workers_runner(f"cost-p{p}", n)))
        # Issue 38: strict record_limit polls (client="native"), 8 workers on 1 partition,
        # each with 10 s of work in the full run.
        for n in (1, 8):
            cases.append(Case(
                "spread", f"spread-p1-w{n}", f"run_workers client=native, 1-partition topic, "
                f"{n} workers, {s.workers_ms:g} ms/record", "spread-p1", True,
                self._workers_runner("spread-p1", n, client="native")))
        # Issue 39 item 4: the source on the native client, numPartitions=8 on 1 partition
        # (each task's strict polls capped by its share of the backlog), 1 ms/record in a
        # mapInArrow after it, each of the 8 tasks with 10 s of work in the full run.
        for n in (1, 8):
            cases.append(Case(
                "spread", f"spread-src-p1-n{n}", f"kafka-share exactly-once client=native, "
                f"1-partition topic, numPartitions={n}, {s.source_spread_ms:g} ms/record",
                "spread-src-p1", True, self._source_spread_runner(n)))
        latency = (("share-eo-defaults",
                    "kafka-share exactly-once, default options (client=native)"),
                   ("share-eo", "kafka-share exactly-once, client=librdkafka"),
                   ("share-amo", "kafka-share at-most-once, client=librdkafka"),
                   ("kafka", "Spark kafka source"))
        for kind, label in latency:
            cases.append(Case("latency", f"latency-{kind}", f"{label} → foreachBatch", None,
                              True, self._latency_runner(kind, s.latency_rate)))
        for kind, label in (latency[0], latency[3]):
            cases.append(Case("latency", f"latency-low-{kind}", f"{label} → foreachBatch", None,
                              True, self._latency_runner(kind, s.latency_low_rate)))
        return cases

    def _workers_runner(self, data: str, workers: int,
                        client: str = "librdkafka") -> Callable[[int], c.Run]:
        suite = "spread" if client == "native" else "workers"

        def run(rnd: int) -> c.Run:
            assert self.spark_bench is not None
            d = self.data[data]
            # The spread suite measures how strict polls share a partition, not how fast Spark
            # starts Python workers: its cases start on warm ones (the warm-up not timed).
            count, wall, processed_s, extra = self.spark_bench.workers(
                d, workers=workers, cost_s=self.sizes.workers_ms / 1000, client=client,
                warm=suite == "spread")
            params = {"workers": workers, "topic_partitions": d.partitions,
                      "cost_ms_per_record": self.sizes.workers_ms, "client": client,
                      "warm_python_workers": suite == "spread"}
            return c.Run(suite, f"{suite}-p{d.partitions}-w{workers}", rnd, count,
                         d.record_bytes, wall, processed_s, params, extra)
        return run

    def _source_spread_runner(self, tasks: int) -> Callable[[int], c.Run]:
        def run(rnd: int) -> c.Run:
            assert self.spark_bench is not None
            d = self.data["spread-src-p1"]
            count, wall, processed_s, extra = self.spark_bench.source_spread(
                d, tasks=tasks, cost_s=self.sizes.source_spread_ms / 1000)
            params = {"source": "share-eo-native", "numPartitions": tasks,
                      "topic_partitions": d.partitions,
                      "cost_ms_per_record": self.sizes.source_spread_ms,
                      "maxBatchDurationMs": 600000, "warm_python_workers": True,
                      "arrow_max_records_per_batch": c.SOURCE_SPREAD_ARROW_BATCH}
            return c.Run("spread", f"spread-src-p1-n{tasks}", rnd, count, d.record_bytes, wall,
                         processed_s, params, extra)
        return run

    def _scale_runner(self, suite: str, name: str, data: str, tasks: int | None,
                      cost_ms: float) -> Callable[[int], c.Run]:
        kind = "kafka" if tasks is None else "share-eo"
        return lambda r: self._spark(suite, name, r, kind, data, tasks=tasks, cost_ms=cost_ms)

    def _latency_runner(self, kind: str, rate: int) -> Callable[[int], c.Run]:
        return lambda r: self._latency(kind, r, rate)

    # -- runners -------------------------------------------------------------------------

    def _python(self, rnd: int, commit: str) -> c.Run:
        data = self.data["main"]
        count, wall, steady, extra = c.python_client(self.kafka, data, threads=data.partitions,
                                                     commit=commit)
        return c.Run("throughput", f"python-{commit}", rnd, count, data.record_bytes, wall,
                     steady, {"threads": data.partitions, "commit": commit}, extra)

    def _java(self, rnd: int) -> c.Run:
        data = self.data["main"]
        count, wall, tool_s, extra = c.java_perf(self.kafka, data, threads=data.partitions)
        return c.Run("throughput", "java-perf", rnd, count, data.record_bytes, wall, tool_s,
                     {"threads": data.partitions}, extra)

    def _spark(self, suite: str, name: str, rnd: int, kind: str, dataset: str, *,
               tasks: int | None = None, cost_ms: float = 0.0) -> c.Run:
        assert self.spark_bench is not None
        data = self.data[dataset]
        df = self.spark_bench.source(kind, data, num_partitions=tasks)
        count, wall, steady, extra = self.spark_bench.drain(df, data, cost_s=cost_ms / 1000)
        params: dict[str, Any] = {"source": kind, "topic_partitions": data.partitions,
                                  "cost_ms_per_record": cost_ms}
        if kind != "kafka":
            params["numPartitions"] = tasks or data.partitions
        return c.Run(suite, name, rnd, count, data.record_bytes, wall, steady, params, extra)

    def _latency(self, kind: str, rnd: int, rate: int) -> c.Run:
        assert self.spark_bench is not None
        s = self.sizes
        count, seconds, extra = self.spark_bench.latency(
            kind, partitions=s.partitions, rate=rate, seconds=s.latency_seconds,
            warmup_s=s.latency_warmup_s)
        params: dict[str, Any] = {"source": kind, "rate": rate,
                                  "topic_partitions": s.partitions,
                                  "warmup_s": s.latency_warmup_s}
        if kind not in ("kafka", "share-eo-defaults"):
            params["options"] = c.LATENCY_SHARE_OPTIONS
        name = f"latency-{kind}" if rate == s.latency_rate else f"latency-low-{kind}"
        return c.Run("latency", name, rnd, count, c.VALUE_BYTES + c.KEY_BYTES,
                     seconds, None, params, extra)


def log(msg: str) -> None:
    print(f"[{datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


def make_spark(jars: list[Path]) -> Any:
    # local_spark's defaults (UI and progress bar off, reused Python workers, ...) plus these.
    return local_spark(MASTER, "pyspark-kafka-share-bench", log_level="ERROR", conf={
        "spark.jars": ",".join(str(j) for j in jars),
        "spark.driver.memory": "4g",
        "spark.sql.streaming.numRecentProgressUpdates": "10000",
    })


def warm_up(bench: Bench) -> None:
    """One unmeasured pass of each Spark source: starts the 8 Python workers, loads classes."""
    assert bench.spark_bench is not None
    data, _ = c.produce_dataset(bench.kafka, "warmup", 4, 20_000)
    start = time.monotonic()
    for kind, tasks in (("share-eo", 8), ("kafka", None)):
        df = bench.spark_bench.source(kind, data, num_partitions=tasks)
        bench.spark_bench.drain(df, data)
    log(f"warm-up done in {time.monotonic() - start:.1f} s")


def select(cases: list[Case], only: str | None) -> list[Case]:
    if not only:
        return cases
    patterns = [p.strip() for p in only.split(",") if p.strip()]
    chosen = [k for k in cases
              if any(fnmatch.fnmatch(k.name, p) or k.suite == p for p in patterns)]
    if not chosen:
        names = ", ".join(k.name for k in cases)
        raise SystemExit(f"--only {only!r} matches no case; suites: throughput, scale, cost, "
                         f"workers, latency; cases: {names}")
    return chosen


def rotated(cases: list[Case], rnd: int, rounds: int) -> list[Case]:
    if not cases:
        return cases
    shift = (rnd * len(cases)) // max(rounds, 1) % len(cases)
    return cases[shift:] + cases[:shift]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small datasets, 1 round (minutes)")
    ap.add_argument("--records", type=int, help="records of the throughput dataset")
    ap.add_argument("--scale-records", type=int, help="records per scale-out topic")
    ap.add_argument("--cost-records", type=int, help="records per per-record-cost topic")
    ap.add_argument("--rounds", type=int, help="rounds (each runs every case once)")
    ap.add_argument("--latency-seconds", type=float, help="length of each latency run")
    ap.add_argument("--only", help="comma-separated case names, globs or suites "
                    "(throughput, scale, cost, workers, spread, latency), e.g. "
                    "'share-*,kafka'")
    ap.add_argument("--out", type=Path, help="where to publish results.json, results.md and "
                    "the plots (default docs/benchmarks/; bench/out/ with --only)")
    ap.add_argument("--spark-kafka-version", help="spark-sql-kafka version (default: "
                    "pyspark's, else " + _jars.FALLBACK_CONNECTOR + ")")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = QUICK if args.quick else FULL
    overrides = {k: v for k, v in (("records", args.records),
                                   ("scale_records", args.scale_records),
                                   ("cost_records", args.cost_records),
                                   ("rounds", args.rounds),
                                   ("latency_seconds", args.latency_seconds))
                 if v is not None}
    sizes = Sizes(**{**asdict(base), **overrides})
    raw_dir = HERE / "out"
    out_dir = args.out or (raw_dir if args.only else REPO / "docs" / "benchmarks")
    raw_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    raw_path = raw_dir / f"results-{stamp}.json"
    started = time.monotonic()
    log(f"mode {sizes.mode}: {sizes}")

    tmp = Path(tempfile.mkdtemp(prefix="kafka-share-bench-"))
    try:
        with LocalKafka(heap="2g") as kafka:
            log(f"broker at {kafka.bootstrap_servers}")
            bench = Bench(sizes, kafka, tmp)
            cases = select(bench.cases(), args.only)
            bench.produce({k.dataset for k in cases if k.dataset})
            connector = "-"
            spark = None
            try:  # Spark stops before the broker: its pooled consumers then close cleanly
                if any(k.uses_spark for k in cases):
                    jars = _jars.ensure_spark_kafka_jars(args.spark_kafka_version)
                    connector = _jars.connector_version()
                    spark = make_spark(jars)
                    bench.spark_bench = c.SparkBench(spark, kafka, tmp)
                    warm_up(bench)
                meta = _machine.describe(REPO, connector)
                doc = run_rounds(bench, cases, sizes=sizes, meta=meta, raw_path=raw_path,
                                 started=started)
            finally:
                if spark is not None:
                    spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _report.publish(doc, out_dir)
    log(f"done in {(time.monotonic() - started) / 60:.1f} min; raw results {raw_path}; "
        f"published to {out_dir}")
    return 0


def run_rounds(bench: Bench, cases: list[Case], *, sizes: Sizes, meta: dict[str, Any],
               raw_path: Path, started: float) -> dict[str, Any]:
    """Every round runs every case once, suite by suite, in a rotated order."""
    runs: list[c.Run] = []
    for rnd in range(sizes.rounds):
        for suite in ("throughput", "scale", "cost", "workers", "spread", "latency"):
            for case in rotated([k for k in cases if k.suite == suite], rnd, sizes.rounds):
                t0 = time.monotonic()
                result = case.run(rnd)
                runs.append(result)
                log(f"round {rnd + 1}/{sizes.rounds} {case.name}: "
                    + _report.describe_run(result) + f" [{time.monotonic() - t0:.1f} s]")
                _write_raw(raw_path, sizes=sizes, meta=meta, bench=bench, runs=runs,
                           started=started, cases=cases)
    return _write_raw(raw_path, sizes=sizes, meta=meta, bench=bench, runs=runs,
                      started=started, cases=cases)


def _write_raw(path: Path, *, sizes: Sizes, meta: dict[str, Any], bench: Bench,
               runs: list[c.Run], started: float, cases: list[Case]) -> dict[str, Any]:
    doc = {
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "mode": sizes.mode,
        "sizes": asdict(sizes),
        "spark_master": MASTER,
        "record": {"value_bytes": c.VALUE_BYTES, "key_bytes": c.KEY_BYTES},
        "producer_config": c.PRODUCER_CONFIG,
        "latency_producer_config": c.LATENCY_PRODUCER_CONFIG,
        "latency_share_options": c.LATENCY_SHARE_OPTIONS,
        "datasets": bench.produced,
        "cases": {k.name: {"suite": k.suite, "label": k.label} for k in cases},
        **meta,
        "elapsed_s": round(time.monotonic() - started, 1),
        "runs": [r.as_dict() for r in runs],
    }
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


if __name__ == "__main__":
    sys.exit(main())
