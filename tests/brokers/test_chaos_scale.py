"""``make chaos-scale`` (marker ``chaos_scale``; not in ``make test-brokers`` nor in CI): the
chaos test's steady stream and seeded fault schedule on the three-broker cluster behind
Toxiproxy, with the cluster's faults (node crashes, leader moves, latency, resets, blackholes,
slow drips: tests/brokers/chaos_scale.py) beside the source's (Python worker SIGKILLs and
exits, query restarts, a task past its lock); then the queue workers with exactly-once
outputs under the cluster's faults and worker SIGKILLs.

Sizes: ``CHAOS_SEED``, ``CHAOS_RECORDS``, ``CHAOS_FAULTS``, ``CHAOS_INTERVAL_S`` (the source's
run, as for ``make chaos``), ``CHAOS_WORKER_RECORDS`` and ``CHAOS_WORKER_FAULTS`` (the workers'
run). ``make chaos-scale`` sets 1,000,000 records and 100 faults for the source, 100,000
records and 25 faults for the workers; without them the sizes are ``make chaos``'s.
``CHAOS_CLIENT=native``: the workers' run on the package's own share consumer.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share.harness import LocalKafka, LocalKafkaCluster, Toxiproxy
from pyspark_kafka_share.workers import Record, Result, start_workers
from tests.brokers.chaos_scale import (
    CLUSTER_KINDS,
    cluster_fault,
    describe,
    scale_schedule,
)
from tests.chaos.chaos_harness import (
    SparkTasks,
    SteadyProducer,
    group_lag,
    kill_busy_worker,
    read_log,
)
from tests.chaos.chaos_schedule import WORKER_SIGKILL, ChaosConfig, Fault, worker_client
from tests.chaos.test_chaos import ChaosRun
from tests.fixtures.brokers import ClusterTopicFactory
from tests.helpers import read_topic, wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

CONFIG = ChaosConfig.from_env()
WORKERS_CONFIG = replace(CONFIG, records=int(os.environ.get("CHAOS_WORKER_RECORDS") or 3_000),
                         faults=int(os.environ.get("CHAOS_WORKER_FAULTS") or 7),
                         topic_partitions=2)  # the workers' source topic: leader-move's range

Report = Callable[[str], None]


class ClusterChaosRun(ChaosRun):
    """The chaos test's run (query, producer, drain, verdict) with the cluster's faults."""

    def __init__(self, config: ChaosConfig, spark: SparkSession, cluster: LocalKafkaCluster,
                 broker: LocalKafka, toxiproxy: Toxiproxy, root: Path,
                 report: Report) -> None:
        super().__init__(config, spark, broker, root, report)
        self.cluster = cluster
        self.toxiproxy = toxiproxy

    def inject(self, fault: Fault) -> str:
        if fault.kind in CLUSTER_KINDS:
            return cluster_fault(self.cluster, self.toxiproxy, fault, self.topic)
        return super().inject(fault)


@pytest.mark.chaos_scale
@pytest.mark.timeout(CONFIG.budget_s())
def test_every_record_lands_exactly_once_under_a_seeded_cluster_fault_schedule(
    spark: SparkSession, kafka_cluster: LocalKafkaCluster, cluster_broker: LocalKafka,
    toxiproxy: Toxiproxy, tmp_path: Path, fault_report: Report,
) -> None:
    config, seed = CONFIG, CONFIG.seed
    began = time.monotonic()
    schedule = scale_schedule(config)
    fault_report(f"chaos-scale seed={seed}: {config.records} records, {config.faults} faults "
                 f"every ~{config.interval_s:.0f}s (replay: CHAOS_SEED={seed} CHAOS_RECORDS="
                 f"{config.records} CHAOS_FAULTS={config.faults} CHAOS_INTERVAL_S="
                 f"{config.interval_s:g} make chaos-scale)")
    for fault in schedule:
        fault_report(f"  scheduled {describe(fault)}")
    run = ClusterChaosRun(config, spark, kafka_cluster, cluster_broker, toxiproxy, tmp_path,
                          fault_report)
    try:
        run.start()
        run.run_faults(schedule)
        run.idle_until(config.chaos_s)
        run.producer.finish()
        run.producer.join(timeout_s=900)
        chaos_s = run.now()
        drain_s = run.drain(timeout_s=240 + config.records / 500)
    finally:
        run.query.stop()
    log = read_log(kafka_cluster.bootstrap_servers, run.topic, config.topic_partitions)
    lag = group_lag(kafka_cluster.bootstrap_servers, run.group, run.topic)
    verdict = run.verdict(log)
    kinds = dict(sorted(Counter(f.kind for f in schedule).items()))
    fault_report(f"chaos-scale seed={seed}: {verdict.expected} records, {verdict.sink_rows} "
                 f"rows; lost {verdict.lost}, duplicated {verdict.duplicated}, wrong value "
                 f"{verdict.wrong_value}; lag {lag}; faults {kinds}; query starts "
                 f"{run.query.starts}; failed task attempts {run.tasks.failed()}; chaos "
                 f"{chaos_s:.0f}s, drain {drain_s}, test {time.monotonic() - began:.0f}s")
    where = f"(seed {seed}; replay with CHAOS_SEED={seed})"
    assert not run.producer.errors, f"producer errors {where}: {run.producer.errors[:5]}"
    assert verdict.exactly_once, f"not exactly once {where}: {verdict}"
    assert lag and all(v == 0 for v in lag.values()), f"group lag is not 0 {where}: {lag}"
    assert drain_s is not None, f"the query did not drain {where}"


def _work(rec: Record) -> Result:
    value = rec.value or b""
    return Result.reject("poison") if int(value) % 50 == 0 else Result.accept(value)


@pytest.mark.chaos_scale
@pytest.mark.timeout(WORKERS_CONFIG.budget_s())
def test_workers_outputs_exactly_once_under_a_seeded_cluster_fault_schedule(
    spark: SparkSession, kafka_cluster: LocalKafkaCluster, cluster_broker: LocalKafka,
    cluster_topic_factory: ClusterTopicFactory, cluster_group: str, toxiproxy: Toxiproxy,
    fault_report: Report,
) -> None:
    config, client = WORKERS_CONFIG, worker_client()
    schedule = scale_schedule(config, kinds=(WORKER_SIGKILL, *CLUSTER_KINDS))
    fault_report(f"workers chaos-scale seed={config.seed}, client={client}: "
                 f"{config.records} records, "
                 f"{config.faults} faults every ~{config.interval_s:.0f}s")
    src, out, dlq = (cluster_topic_factory(n) for n in (config.topic_partitions, 1, 1))
    kafka_cluster.set_group_config(cluster_group, "share.record.lock.duration.ms", 8_000)
    kafka_cluster.set_group_config(cluster_group, "share.delivery.count.limit", 10)
    bootstrap = kafka_cluster.bootstrap_servers
    producer = SteadyProducer(bootstrap, src, config.topic_partitions, config.rate,
                              config.records)
    job = start_workers(spark, _work, topics=src, group=cluster_group, client=client,
                        bootstrap_servers=bootstrap, workers=2, chunk_size=10,
                        output_topic=out, dead_letter_topic=dlq, exactly_once_outputs=True,
                        max_attempts=10, broker_timeout_s=60, on_progress=False)
    rng = random.Random(config.seed)
    began = time.monotonic()
    producer.start()
    try:
        for fault in schedule:
            time.sleep(max(0.0, fault.at_s - (time.monotonic() - began)))
            what = kill_busy_worker(SparkTasks(spark), rng.randrange(4)) \
                if fault.kind == WORKER_SIGKILL else cluster_fault(kafka_cluster, toxiproxy,
                                                                   fault, src)
            fault_report(f"  t={time.monotonic() - began:6.1f}s {describe(fault)}: {what}")
        producer.finish()
        producer.join(900)
        wait_for(lambda: group_lag(bootstrap, cluster_group, src),
                 lambda lag: len(lag) == 2 and all(v == 0 for v in lag.values()),
                 timeout_s=240 + config.records / 100, what="the workers drain the group")
    finally:
        summary = job.stop("the test is done", grace_s=120)
    assert summary is not None
    stats = Counter[str]()
    for w in summary.workers:
        stats.update({k: int(w.get(k, 0)) for k in ("transactions", "transactions_aborted",
                                                     "already_committed", "marker_conflicts",
                                                     "marker_overlaps_aborted")})
    produced = set(producer.delivered)
    poison = {v for v in produced if v % 50 == 0}
    outputs = Counter(int(m.value() or b"-1") for m in read_topic(
        cluster_broker, out, len(produced) - len(poison), timeout_s=300, settle_s=2))
    dead = Counter(int(m.value() or b"-1") for m in read_topic(
        cluster_broker, dlq, len(poison), settle_s=2))
    dups = [v for v, c in (outputs + dead).items() if c > 1]
    lost = produced - set(outputs) - set(dead)
    fault_report(f"workers chaos-scale seed={config.seed}: {len(produced)} produced, "
                 f"{sum(outputs.values())} outputs, {sum(dead.values())} dead letters, "
                 f"{len(dups)} duplicated, {len(lost)} lost; {len(summary.failed_attempts)} "
                 f"attempt(s) died; {dict(stats)} (marker_conflicts: a canary, docs/design.md)")
    assert not dups, f"{len(dups)} records twice (read_committed), e.g. {dups[:5]}"
    assert not lost, f"{len(lost)} records lost, e.g. {sorted(lost)[:5]}"
    assert set(dead) == poison
