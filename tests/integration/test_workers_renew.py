"""RENEW for long work (``client="native"``) against a real broker and local Spark.

A 6 s group lock and a function that runs 18 s per record, 2 workers in chunks of 1: the
workers renew the locks of the record their function is working on, so each record is
processed once (the call log, as in test_workers_eos.py), never delivered a second time (to
another worker or the same), and every acknowledgement succeeds. With librdkafka the same
work would be redelivered at the lock's end (docs/workers.md, "Limits").
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share._kafka.group import RENEW_CONFIG
from pyspark_kafka_share.admin import ShareGroupAdmin
from pyspark_kafka_share.harness import LocalKafka
from pyspark_kafka_share.workers import Record, Result, start_workers
from tests.fixtures.kafka import TopicFactory
from tests.helpers import (
    assert_exactly_once,
    log_call,
    output_origins,
    read_calls,
    read_topic,
    stop_when_drained,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

# Three lock periods of work prove renewal across several locks; a 6 s lock (was 15 s, with a
# 45 s function) proves the same in 18 s instead of 45 s per record. The renewal comes every
# 1.5 s, 4.5 s before the lock would end: the margin a loaded machine's scheduling gets.
LOCK_MS = 6_000
WORK_S = 18.0  # three locks: without RENEW the record is redelivered twice meanwhile
N = 4


def _renew_allowed(kafka: LocalKafka, group: str) -> str | None:
    """The group's share.renew.acknowledge.enable (None: the broker has no such config)."""
    with ShareGroupAdmin(kafka.bootstrap_servers) as admin:
        return admin.get_config(group).get(RENEW_CONFIG)


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at-least-once", "exactly-once"])
def test_work_three_times_the_lock_is_renewed_and_processed_once(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
    tmp_path: Path, exactly_once: bool,
) -> None:
    src, out = topic_factory(1), topic_factory(1)
    kafka.set_group_config(group, "share.record.lock.duration.ms", LOCK_MS)
    renew_config = _renew_allowed(kafka, group) is not None  # Kafka 4.3+ (KIP-1240)
    if renew_config and not exactly_once:
        # RENEW turned off for the group: start_workers turns it on (the harness's principal
        # may alter the group's configs).
        kafka.set_group_config(group, RENEW_CONFIG, "false")
    kafka.produce(src, [str(i).encode() for i in range(N)])
    log = str(tmp_path / "calls.jsonl")

    def slow(rec: Record) -> Result:
        log_call(log, rec)
        time.sleep(WORK_S)  # the long work itself: three times the lock
        return Result.accept(rec.value)

    job = start_workers(spark, slow, client="native", topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2, chunk_size=1,
                        output_topic=out, exactly_once_outputs=exactly_once,
                        on_progress=False)
    # timeout_s only bounds a hang: N records of 18 s on 2 workers take about 36 s.
    summary = stop_when_drained(job, kafka, group, timeout_s=600)
    if renew_config:
        assert _renew_allowed(kafka, group) == "true"
    calls = read_calls(Path(log))
    # Each record processed once, on its first delivery: no worker got it a second time.
    assert sorted(c["value"] for c in calls) == [str(i) for i in range(N)], calls
    assert all(c["dc"] == 1 for c in calls), calls
    t = summary.totals
    assert (t["accepted"], t["ack_failures"], t["renew_failures"]) == (N, 0, 0), str(summary)
    assert t["released_lock_deadline"] == 0 and t["released"] == 0, str(summary)
    # Renewed every half lock budget (1.5 s) for 18 s: about 12 times per record.
    assert t["renewed"] >= N * 6, str(summary)
    assert_exactly_once(output_origins(read_topic(kafka, out, N)),
                        {(src, 0, i) for i in range(N)})


SHORT_LOCK_MS = 5_000
SHORT_WORK_S = 11.0  # more than two locks


@pytest.mark.kafka_subset
@pytest.mark.spark_subset
def test_a_short_lock_outlived_twice_is_renewed_on_every_kafka_line(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
    tmp_path: Path,
) -> None:
    """The cheapest RENEW test, in the version tiers (on 4.2.2 and 4.3.1 too, which run only
    what they select): a 5 s group lock (the harness's brokers allow locks from 1 s) and a
    function of 11 s, 2 records on 2 workers at least once: each processed once, on its first
    delivery, every renewal confirmed."""
    src = topic_factory(1)
    kafka.set_group_config(group, "share.record.lock.duration.ms", SHORT_LOCK_MS)
    kafka.produce(src, [b"0", b"1"])
    log = str(tmp_path / "calls.jsonl")

    def slow(rec: Record) -> Result:
        log_call(log, rec)
        time.sleep(SHORT_WORK_S)
        return Result.accept()  # no output topic: the call log is the record

    job = start_workers(spark, slow, client="native", topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2, chunk_size=1,
                        on_progress=False)
    summary = stop_when_drained(job, kafka, group, timeout_s=300)  # bounds a hang only
    calls = read_calls(Path(log))
    assert sorted(c["value"] for c in calls) == ["0", "1"], calls
    assert all(c["dc"] == 1 for c in calls), calls
    t = summary.totals
    assert (t["accepted"], t["ack_failures"], t["renew_failures"]) == (2, 0, 0), str(summary)
    # Renewed every half lock budget (1.25 s) for 11 s: about 8 times per record.
    assert t["renewed"] >= 2 * 4, str(summary)
