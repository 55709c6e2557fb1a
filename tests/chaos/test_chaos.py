"""Chaos: a steady producer, an exactly-once query, and a seeded schedule of real faults.

A background thread produces numbered records at a steady rate into a 4-partition topic; a
``kafka-share`` query (journal, 2 tasks) writes them to a Parquet file sink with a checkpoint.
Meanwhile the schedule (``chaos_schedule.make_schedule``: a pure function of the seed, printed
before anything starts) injects its faults, every kind at least once:

- ``worker-sigkill``: ``kill -9`` of a PySpark Python worker that is running a task;
- ``worker-exit``: a restart with a ``kill-after-publish`` / ``kill-after-end`` point on the
  next new batch: the worker dies (``os._exit``) between journal and ACCEPT, or after END;
- ``broker-crash``: the test's own broker SIGKILLed, down for seconds, restarted on its data;
- ``query-restart``: the query stopped wherever it is and started again from its checkpoint;
- ``lock-expiry``: a restart with a task sleeping longer than the group's acquisition lock
  (``share.record.lock.duration.ms``) before it publishes: the broker takes the records back
  and delivers them again.

A query that dies (a batch out of task retries during a broker outage) is restarted from its
checkpoint, as an operator would. Then production stops, the query drains, and the test
asserts that the sink holds every record of the topic exactly once (no loss, no duplicate,
the right value at every offset) and that the group's lag is 0.

Run: ``make chaos`` (CI size), ``make chaos-long``; ``CHAOS_SEED=<seed> make chaos`` replays
a schedule. See ``chaos_schedule`` for the environment variables.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pyspark_kafka_share.harness import LocalKafka
from pyspark_kafka_share.workers.config import ShareClient
from tests.chaos.chaos_harness import (
    ChaosQuery,
    SparkTasks,
    SteadyProducer,
    configure_group,
    crash_broker,
    group_lag,
    kill_busy_worker,
    read_log,
    sink_count,
    sink_rows,
)
from tests.chaos.chaos_schedule import (
    BROKER_CRASH,
    LOCK_EXPIRY,
    QUERY_RESTART,
    WORKER_EXIT,
    WORKER_SIGKILL,
    ChaosConfig,
    Fault,
    chaos_clients,
    make_schedule,
)

CONFIG = ChaosConfig.from_env()

Report = Callable[[str], None]


@dataclass(frozen=True)
class Verdict:
    """What the sink holds against what the topic holds."""

    expected: int
    sink_rows: int
    lost: int
    duplicated: int
    wrong_value: int
    unexpected: int
    max_delivery_count: int
    redelivered_rows: int
    examples: str

    @property
    def exactly_once(self) -> bool:
        return not (self.lost or self.duplicated or self.wrong_value or self.unexpected) \
            and self.sink_rows == self.expected


class ChaosRun:
    """One chaos run: setup, the faults on schedule, the drain, the verdict."""

    def __init__(self, config: ChaosConfig, spark: SparkSession, kafka: LocalKafka, root: Path,
                 report: Report, clients: tuple[ShareClient, ...] = ("librdkafka",)) -> None:
        self.config = config
        self.spark = spark
        self.kafka = kafka
        self.report = report
        self.topic = kafka.create_topic(f"chaos-{config.seed}", config.topic_partitions)
        self.group = f"chaos-{config.seed}"
        group_configs: dict[str, str | int] = {
            "share.auto.offset.reset": "earliest",
            "share.record.lock.duration.ms": config.lock_ms,
            "share.delivery.count.limit": config.delivery_limit}
        configure_group(kafka, self.group, group_configs, report)
        self.tasks = SparkTasks(spark)
        self.query = ChaosQuery(spark, kafka, self.topic, self.group, root, config.tasks,
                                self.tasks, report, clients)
        self.producer = SteadyProducer(kafka.bootstrap_servers, self.topic,
                                       config.topic_partitions, config.rate, config.records)
        self.t0 = 0.0
        self.fault_ended = 0.0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def idle_until(self, t: float) -> None:
        """Until chaos time ``t``, keep the query running (restart it if a batch failed)."""
        while self.now() < t:
            self.query.ensure_running()
            time.sleep(min(0.5, max(0.0, t - self.now())))

    def start(self) -> None:
        self.query.start()
        self.producer.start()
        self.t0 = time.monotonic()

    def inject(self, fault: Fault) -> str:
        """Run one fault; what it did, for the report."""
        if fault.kind == WORKER_SIGKILL:
            return kill_busy_worker(self.tasks, fault.victim)
        if fault.kind == WORKER_EXIT:
            used = self.query.restart(f"{fault.point}:part={fault.part}:attempt=0")
            return f"query restarted with _faultInjection={used}"
        if fault.kind == BROKER_CRASH:
            return crash_broker(self.kafka, fault.down_s, self.report)
        if fault.kind == QUERY_RESTART:
            self.query.restart(pause_s=fault.pause_s)
            return "query stopped and started from its checkpoint"
        if fault.kind == LOCK_EXPIRY:
            sleep_ms = self.config.lock_ms * 3 // 2  # lock 4 s: the task sleeps 6 s holding it
            used = self.query.restart(f"sleep-before-publish:part={fault.part}:attempt=0:"
                                      f"ms={sleep_ms}")
            return f"query restarted with _faultInjection={used}"
        raise AssertionError(f"unknown fault kind {fault.kind!r}")

    def await_commit(self, batch: int, cap_s: float) -> str:
        """Until Spark committed ``batch`` (the system recovered from the previous fault and
        made progress), at most ``cap_s``; says how it went, for the report."""
        started = self.now()
        while self.query.committed() < batch and self.now() - started < cap_s:
            self.query.ensure_running()
            time.sleep(0.5)
        waited = self.now() - started
        if self.query.committed() < batch:
            return f"batch {batch} NOT committed after {waited:.0f}s: went ahead"
        return f"batch {batch} committed {self.now() - self.fault_ended:.0f}s after"

    def run_faults(self, schedule: list[Fault]) -> None:
        """Each fault at its time, but not before one batch planned after the previous fault
        has committed: the faults hit a query that makes progress, not one stuck in
        recovery (a fault-injected restart's fault is in that batch).

        A fault's report line is written once that batch committed: it shows what the fault
        did and the failed task attempts Spark counted until then (a worker death is one).
        """
        progress = 0  # the batch the next fault waits for
        pending: str | None = None
        failed = self.tasks.failed()
        for fault in [*schedule, None]:
            if fault is not None:
                self.idle_until(fault.at_s)
            gate = self.await_commit(progress, cap_s=120)
            now_failed = self.tasks.failed()
            if pending is not None:
                self.report(f"{pending}; {gate}; +{now_failed - failed} failed task attempts")
            failed = now_failed
            if fault is None:
                break
            started = self.now()
            outcome = self.inject(fault)
            self.fault_ended = self.now()
            progress = self.query.planned() + 1
            pending = (f"  t={started:6.1f}s fault #{fault.index} {fault.kind}: {outcome} "
                       f"({self.fault_ended - started:.1f}s)")
            self.query.collect_metrics()

    def drain(self, timeout_s: float) -> float | None:
        """After production: until the group's lag is 0 on every partition and the sink holds
        at least as many rows as were produced. Seconds it took, None on timeout."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            self.query.ensure_running()
            try:
                lag = group_lag(self.kafka.bootstrap_servers, self.group, self.topic)
            except Exception as exc:  # noqa: BLE001 - e.g. a coordinator still loading
                self.report(f"  lag unreadable: {exc}")
                lag = {}
            drained = len(lag) == self.config.topic_partitions and all(
                v == 0 for v in lag.values())
            if drained and sink_count(self.spark, self.query.out) >= len(
                    self.producer.delivered):
                return time.monotonic() - started
            time.sleep(2)
        return None

    def verdict(self, log: dict[tuple[int, int], int]) -> Verdict:
        rows = sink_rows(self.spark, self.query.out)
        seen = Counter((r.partition, r.offset) for r in rows)
        dups = sorted(k for k, c in seen.items() if c > 1)
        lost = sorted(set(log) - set(seen))
        unexpected = sorted(set(seen) - set(log))
        wrong = [r for r in rows if (r.partition, r.offset) in log
                 and log[(r.partition, r.offset)] != r.value]
        return Verdict(
            expected=len(log), sink_rows=len(rows), lost=len(lost), duplicated=len(dups),
            wrong_value=len(wrong), unexpected=len(unexpected),
            max_delivery_count=max((r.delivery_count for r in rows), default=0),
            redelivered_rows=sum(1 for r in rows if r.delivery_count > 1),
            examples=f"lost e.g. {lost[:5]}, duplicated e.g. "
                     f"{[(d, seen[d]) for d in dups[:5]]} ((partition, offset), times), "
                     f"wrong value e.g. {wrong[:3]}, not in the topic e.g. {unexpected[:5]}",
        )


@pytest.mark.chaos
@pytest.mark.timeout(CONFIG.budget_s())
@pytest.mark.parametrize("client", chaos_clients())
def test_every_record_lands_exactly_once_under_a_seeded_fault_schedule(
    spark: SparkSession, chaos_kafka: LocalKafka, tmp_path: Path, chaos_report: Report,
    client: ShareClient,
) -> None:
    config = CONFIG
    seed = config.seed
    print(f"chaos seed={seed}", flush=True)
    began = time.monotonic()
    schedule = make_schedule(config)
    chaos_report(f"chaos seed={seed}, client={client}: {config.records} records, "
                 f"{config.faults} faults every ~{config.interval_s:.0f}s (replay: "
                 f"CHAOS_SEED={seed} CHAOS_RECORDS={config.records} "
                 f"CHAOS_FAULTS={config.faults} CHAOS_CLIENT={client} make chaos)")
    for fault in schedule:
        chaos_report(f"  scheduled {fault.describe()}")

    run = ChaosRun(config, spark, chaos_kafka, tmp_path, chaos_report, (client,))
    try:
        run.start()
        chaos_report(f"  setup {time.monotonic() - began:.0f}s (topic, group configs, the "
                     f"query's start); producing {config.rate:.0f} records/s until the "
                     f"last fault is done, at least {config.records}")
        run.run_faults(schedule)
        run.idle_until(config.chaos_s)
        run.producer.finish()
        run.producer.join(timeout_s=600)
        chaos_s = run.now()
        chaos_report(f"  t={chaos_s:6.1f}s production done: {len(run.producer.delivered)} "
                     f"delivered; draining")
        drain_s = run.drain(timeout_s=240 + config.records / 500)
    finally:
        run.query.stop()

    log = read_log(chaos_kafka.bootstrap_servers, run.topic, config.topic_partitions)
    lag = group_lag(chaos_kafka.bootstrap_servers, run.group, run.topic)
    verdict = run.verdict(log)
    kinds = Counter(f.kind for f in schedule)
    metrics = run.query.metrics
    chaos_report(
        f"chaos seed={seed}: {verdict.expected} records in the topic, {verdict.sink_rows} "
        f"rows in the sink; lost {verdict.lost}, duplicated {verdict.duplicated}, wrong value "
        f"{verdict.wrong_value}; lag {lag}")
    chaos_report(
        f"  faults {dict(sorted(kinds.items()))}; query starts {run.query.starts} "
        f"({len(run.query.failures)} after a failed run); failed task attempts "
        f"{run.tasks.failed()}; rows delivered more than once {verdict.redelivered_rows} "
        f"(max deliveryCount {verdict.max_delivery_count}); source metrics over "
        f"{len(metrics.batches)} batches: redelivered {metrics.total('redelivered')}, "
        f"duplicates dropped {metrics.total('duplicates_dropped')}, released at lock deadline "
        f"{metrics.total('released_lock_deadline')}, commit failures "
        f"{metrics.total('commit_failures')}")
    drained = "timed out" if drain_s is None else f"{drain_s:.0f}s"
    chaos_report(f"  durations: chaos {chaos_s:.0f}s, drain {drained}, "
                 f"test {time.monotonic() - began:.0f}s")
    for reason in run.query.failures:
        chaos_report(f"  failed query run: {reason}")

    where = f"(chaos seed={seed}; replay with CHAOS_SEED={seed})"
    assert not run.producer.errors, f"producer errors {where}: {run.producer.errors[:5]}"
    not_in_log = {v: k for v, k in run.producer.delivered.items() if log.get(k) != v}
    assert len(run.producer.delivered) == run.producer.produced and not not_in_log, \
        f"the broker lost acknowledged produced records {where}: {list(not_in_log.items())[:5]}"
    assert verdict.exactly_once, f"not exactly once {where}: {verdict}"
    assert lag and all(v == 0 for v in lag.values()), f"group lag is not 0 {where}: {lag}"
    assert drain_s is not None, f"the query did not drain {where}"
