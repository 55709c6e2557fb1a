"""The queue workers with exactly-once outputs on the three-broker cluster: the broker that
coordinates the share group is SIGKILLed while a worker sits between its produce and its
commit. The group's coordination moves to another node; a ``read_committed`` reader of the
output and dead-letter topics sees every origin exactly once."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share.harness import LocalKafka, LocalKafkaCluster
from pyspark_kafka_share.workers import Record, Result, start_workers
from tests.fixtures.brokers import ClusterTopicFactory
from tests.helpers import (
    assert_exactly_once,
    group_lag,
    output_origins,
    produce_spread,
    read_topic,
    spread_keys,
    wait_for,
    worker_faults,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

N = 200  # records over 2 partitions


def _poison(value: bytes) -> bool:
    return int(value[1:]) % 7 == 0


def _work(rec: Record) -> Result:
    value = rec.value or b""
    return Result.reject("poison") if _poison(value) else Result.accept(value + b"-out")


def test_workers_exactly_once_outputs_when_the_group_coordinator_is_killed_mid_transaction(
    spark: SparkSession, kafka_cluster: LocalKafkaCluster, cluster_broker: LocalKafka,
    cluster_topic_factory: ClusterTopicFactory, cluster_group: str,
    fault_report: Callable[[str], None],
) -> None:
    src, out, dlq = (cluster_topic_factory(n) for n in (2, 1, 1))
    kafka_cluster.set_group_config(cluster_group, "share.record.lock.duration.ms", 12_000)
    produce_spread(cluster_broker, src, 2, N)
    keys = spread_keys(src, 2, N)
    poison = {(src, i % 2, i // 2) for i in range(N) if _poison(b"v%d" % i)}
    job = start_workers(spark, _work, topics=src, group=cluster_group,
                        bootstrap_servers=kafka_cluster.bootstrap_servers, workers=2,
                        chunk_size=5, output_topic=out, dead_letter_topic=dlq,
                        exactly_once_outputs=True, on_progress=False, broker_timeout_s=60,
                        transaction_interval_s=0,
                        **worker_faults("sleep-before-commit:part=0:attempt=0:seq=2:ms=4000"))
    try:
        wait_for(lambda: job.progress().workers.get(0, {}),
                 lambda w: w.get("transactions", 0) >= 1 and w.get("processed", 0) >= 6,
                 timeout_s=180, what="worker 0 in its second transaction")
        node = kafka_cluster.group_coordinator(cluster_group)
        kafka_cluster.kill(node)
        moved = wait_for(lambda: kafka_cluster.group_coordinator(cluster_group),
                         lambda n: n != node, 60, "the group's coordinator moved")
        deadline = time.monotonic() + 300
        while (lag := group_lag(cluster_broker, cluster_group)) != 0 \
                and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        summary = job.stop("the test is done", grace_s=120)
    assert summary is not None
    aborted = sum(int(w.get("transactions_aborted", 0)) for w in summary.workers)
    conflicts = sum(int(w.get("marker_conflicts", 0)) for w in summary.workers)
    fault_report(f"node {node} (the group's coordinator) killed while worker 0 was between "
                 f"produce and commit; coordination moved to node {moved}; "
                 f"{aborted} transactions aborted, {conflicts} marker conflicts; lag {lag}")
    assert lag == 0, f"records left in the group: {summary}"
    outputs = read_topic(cluster_broker, out, N - len(poison), settle_s=1.0)
    dead = read_topic(cluster_broker, dlq, len(poison), settle_s=1.0)
    assert_exactly_once(output_origins(outputs), keys - poison)
    assert_exactly_once(output_origins(dead), poison)
