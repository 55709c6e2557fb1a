"""A worker job's own ``/metrics`` (``serve_worker_metrics``) scraped over HTTP while the job
runs on a real broker and a local Spark session: the counters move as records arrive, end at
the summary's totals, and agree with the exporter's view of the same group (lag 0, the
dead-letter topic's end offsets)."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from pyspark import cloudpickle

from pyspark_kafka_share.exporter.workers import serve_worker_metrics
from pyspark_kafka_share.harness import LocalKafka, ProducerRecord
from pyspark_kafka_share.workers import Record, start_workers
from pyspark_kafka_share.workers.api import COUNTERS
from tests.fixtures.kafka import TopicFactory
from tests.helpers import stop_when_drained, wait_for
from tests.integration.test_exporter import Samples, exporting, partitions, scrape

# The worker function runs in Spark's Python workers, which cannot import this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]


def _handle(rec: Record) -> None:
    value = (rec.value or b"").decode()
    if value.startswith("broken"):
        raise KeyError("no such field")  # not in retry_on: dead-lettered at once
    if value.startswith("flaky"):
        raise TimeoutError("still down")  # retried, gives up after max_attempts


def _sums(samples: Samples, group: str) -> dict[str, float]:
    """Each worker metric of ``group`` summed over its workers (and types)."""
    out: dict[str, float] = {}
    for (name, labels), value in samples.items():
        if name.startswith("kafka_share_workers_") and dict(labels).get("group") == group:
            out[name] = out.get(name, 0.0) + value
    return out


def test_a_running_job_s_counters_move_and_end_at_the_summary(
    spark: Any, kafka: LocalKafka, topic_factory: TopicFactory, group: str,
) -> None:
    topic, dlq = topic_factory(2), topic_factory(1)
    kafka.produce(topic, [ProducerRecord(value=b"ok-%d" % i, partition=i % 2)
                          for i in range(20)])
    job = start_workers(spark, _handle, topics=[topic], group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2,
                        dead_letter_topic=dlq, max_attempts=2, retry_on=(TimeoutError,),
                        on_progress=False)
    server, _ = serve_worker_metrics(job, 0, "127.0.0.1")
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        first = _sums(wait_for(lambda: scrape(url), lambda s: _sums(s, group).get(
            "kafka_share_workers_accepted_total") == 20, timeout_s=240,
            what="20 records accepted in the job's metrics"), group)
        assert first["kafka_share_workers_job_active"] == 1
        assert "kafka_share_workers_job_failed" not in first
        # More records, among them poison and records that give up: the counters move on.
        kafka.produce(topic, [ProducerRecord(value=v, partition=i % 2) for i, v in enumerate(
            [b"ok-more-%d" % i for i in range(18)] + [b"broken-%d" % i for i in range(4)]
            + [b"flaky-0", b"flaky-1"])])
        moved = _sums(wait_for(lambda: scrape(url), lambda s: _sums(s, group).get(
            "kafka_share_workers_dead_lettered_total") == 6, timeout_s=240,
            what="6 records dead-lettered in the job's metrics"), group)
        assert moved["kafka_share_workers_processed_total"] > \
            first["kafka_share_workers_processed_total"]
        assert moved["kafka_share_workers_accepted_total"] == 38
        assert moved["kafka_share_workers_exhausted_total"] == 2
        assert moved["kafka_share_workers_rejected_total"] == 6
        failures: dict[str, float] = {}  # by type, summed over the workers
        for (name, labels), value in scrape(url).items():
            if name == "kafka_share_workers_failures_total":
                kind = dict(labels)["type"]
                failures[kind] = failures.get(kind, 0.0) + value
        assert failures == {"KeyError": 4, "TimeoutError": 4}, failures  # flaky: 2 tries each
        # The exporter sees the same group drained and the same 6 dead letters.
        with exporting(kafka.bootstrap_servers, [group],
                       dead_letter_topics={group: dlq}) as exporter_url:
            outside = wait_for(lambda: scrape(exporter_url), lambda s: s.get(
                ("kafka_share_group_lag", (("group", group),))) == 0, timeout_s=120,
                what="the exporter's lag 0")
            assert partitions(outside, "kafka_share_partition_lag", group) == {
                (topic, 0): 0, (topic, 1): 0}
            assert partitions(outside, "kafka_share_dead_letter_end_offset", group) == {
                (dlq, 0): moved["kafka_share_workers_dead_lettered_total"]}
        summary = stop_when_drained(job, kafka, group)
        last = scrape(url)
        ended = _sums(last, group)
        assert ended["kafka_share_workers_job_active"] == 0
        assert ended["kafka_share_workers_in_flight"] == 0
        for key in COUNTERS:  # the metrics end at the summary's totals (*_ms in seconds)
            in_ms = key.endswith("_ms")
            name = "kafka_share_workers_" + (key.removesuffix("_ms") + "_seconds_total"
                                             if in_ms else f"{key}_total")
            want = summary.totals[key] / (1000 if in_ms else 1)
            assert ended.get(name, 0) == pytest.approx(want), (name, ended.get(name),
                                                               str(summary))
        assert {dict(labels)["worker"] for (name, labels) in last
                if name == "kafka_share_workers_processed_total"} == {"0", "1"}
    finally:
        if not job.done:
            job.stop("the test is done", grace_s=120)
        server.shutdown()
        server.server_close()
