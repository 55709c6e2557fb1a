"""The queue workers' Kafka control channel against a real broker, from a classic session.

Spark Connect clients always use it (tests/connect/test_connect_workers.py); a classic session
uses it when ``control_topic`` is set (a driver the executors cannot reach). Here: the lease
keeps a second attempt of a running worker out of the group with real clients, and a classic
job's progress, stop and summary travel through the topic.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from pyspark.sql import SparkSession

from pyspark_kafka_share._kafka.settings import WORKER_NAMES, ClientSettings
from pyspark_kafka_share.harness import LocalKafka
from pyspark_kafka_share.workers import Record, start_workers
from tests.helpers import wait_for


def test_a_second_attempt_waits_for_the_lease_over_the_control_topic(
    kafka: LocalKafka, topic: str, group: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As test_workers.py's TCP test: two attempts of worker 0 in threads, as Spark's
    speculation would run them; the copy opens no consumer while the holder runs, and ends
    without one when the holder finishes."""
    from pyspark_kafka_share.admin import ShareGroupAdmin
    from pyspark_kafka_share.workers import loop
    from pyspark_kafka_share.workers.config import WorkerConfig, WorkerSpec
    from pyspark_kafka_share.workers.control_kafka import KafkaControlServer

    kafka.produce(topic, [b"%d" % i for i in range(50)])
    ident = threading.local()
    monkeypatch.setattr(loop, "attempt_identity", lambda: (0, 0, ident.attempt))
    client = ClientSettings(kafka.bootstrap_servers, group, names=WORKER_NAMES)
    server = KafkaControlServer.open(client, f"ctl-{topic}", "job-lease")
    config = WorkerConfig.create(topics=topic, group=group, time_budget_s=12,
                                 bootstrap_servers=kafka.bootstrap_servers)
    spec = WorkerSpec(config, lock_ms=30_000, delivery_limit=5, control=server.endpoint,
                      report_interval_s=0.2)
    results: dict[int, dict[str, Any]] = {}

    def attempt(n: int) -> None:
        ident.attempt = n
        results[n] = loop.run_worker(spec, lambda r: None)

    holder = threading.Thread(target=attempt, args=(0,))
    holder.start()
    try:
        with ShareGroupAdmin(kafka.bootstrap_servers, timeout_s=10) as admin:
            wait_for(lambda: server.latest().get(0, {}).get("processed", 0), lambda p: p == 50,
                     30, "the first attempt's report over the control topic")
            copy = threading.Thread(target=attempt, args=(1,))
            copy.start()
            time.sleep(3)
            members = admin.describe(group).members
            assert len(members) == 1, f"a second consumer joined: {members}"
            copy.join(30)
            holder.join(30)
    finally:
        holder.join(30)
        server.close()
    assert results[0]["state"] == "stopped" and results[0]["processed"] == 50
    assert results[1]["state"] == "duplicate", results[1]
    assert "received" not in results[1]  # it never polled


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
