"""The queue workers' Kafka control channel against a real broker, from a classic session.

Spark Connect clients always use it (tests/connect/test_connect_workers.py); a classic session
uses it when ``control_topic`` is set (a driver the executors cannot reach). Here: the lease
keeps a second attempt of a running worker out of the group with real clients, and a classic
job's progress, stop and summary travel through the topic.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from pyspark_kafka_share._kafka.settings import WORKER_NAMES, ClientSettings
from pyspark_kafka_share.harness import LocalKafka
from pyspark_kafka_share.workers import Record, start_workers
from tests.helpers import check_lease_keeps_second_attempt_out, wait_for


def test_a_second_attempt_waits_for_the_lease_over_the_control_topic(
    kafka: LocalKafka, topic: str, group: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As test_workers.py's TCP test: two attempts of worker 0 in threads, as Spark's
    speculation would run them; the copy opens no consumer while the holder runs, and ends
    without one when the holder finishes."""
    from pyspark_kafka_share.workers.control_kafka import KafkaControlServer

    client = ClientSettings(kafka.bootstrap_servers, group, names=WORKER_NAMES)
    check_lease_keeps_second_attempt_out(
        kafka, topic, group, monkeypatch,
        KafkaControlServer.open(client, f"ctl-{topic}", "job-lease"))


def test_a_classic_session_with_control_topic_reports_and_stops_through_it(
    kafka: LocalKafka, topic: str, group: str, spark: SparkSession,
) -> None:
    n = 200
    kafka.produce(topic, [f"{i}".encode() for i in range(n)],
                  producer_config={"linger.ms": "50"})
    control = f"ctl-{topic}"

    def slow(rec: Record) -> None:
        time.sleep(0.05)

    job = start_workers(spark, slow, topics=topic, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, chunk_size=5,
                        control_topic=control, on_progress=False)
    assert job._spec.control is not None and \
        getattr(job._spec.control, "topic", None) == control  # not the driver's port
    wait_for(lambda: job.progress().totals["processed"], lambda p: p >= 20, 60,
             "progress over the control topic")
    summary = job.stop()
    assert summary is not None and summary.stop_reason == "stopped by user", str(summary)
    t = summary.totals
    assert 0 < t["accepted"] < n and t["released_on_stop"] > 0, str(summary)
    md = AdminClient({"bootstrap.servers": kafka.bootstrap_servers}).list_topics(timeout=10)
    assert len(md.topics[control].partitions) == 2
