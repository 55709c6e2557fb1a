"""A Spark Connect client serves its own ``/metrics`` (marker ``connect``): the queue workers'
(``serve_worker_metrics``: the client holds the workers' reports from the control topic) and
the queries' (``serve_query_metrics``: from a poll of ``recentProgress``, since PySpark's
Connect client drops its client-side listeners once a Python data source runs), scraped over
HTTP while a job and a query run."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share.exporter.query import serve_query_metrics
from pyspark_kafka_share.exporter.workers import serve_worker_metrics
from pyspark_kafka_share.harness import LocalKafka
from pyspark_kafka_share.workers import Record, start_workers
from tests.fixtures.kafka import TopicFactory
from tests.helpers import (
    assert_exactly_once,
    produce_spread,
    share_stream,
    sink_keys,
    stop_when_drained,
    wait_for,
)
from tests.integration.test_exporter import Samples, scrape

# The worker function runs in the server's Python workers: ship this module by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]


def _accept(record: Record) -> None:
    return None


def _summed(samples: Samples, name: str, group: str) -> float:
    return sum(v for (n, labels), v in samples.items()
               if n == name and dict(labels).get("group") == group)


def test_the_workers_metrics_from_a_connect_client(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str,
    connect_spark: SparkSession, connect_report: Callable[[str], None],
) -> None:
    topic = topic_factory(2)
    produce_spread(kafka, topic, 2, 200)
    job = start_workers(connect_spark, _accept, topics=topic, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2,
                        on_progress=False)
    server, _ = serve_worker_metrics(job, 0, "127.0.0.1")
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        seen = wait_for(lambda: scrape(url), lambda s: _summed(
            s, "kafka_share_workers_accepted_total", group) == 200, timeout_s=180,
            what="200 records accepted in the client's worker metrics")
        assert _summed(seen, "kafka_share_workers_job_active", group) == 1
        summary = stop_when_drained(job, kafka, group)
        ended = scrape(url)
        assert _summed(ended, "kafka_share_workers_job_active", group) == 0
        for key in ("processed", "accepted", "released", "received"):
            assert _summed(ended, f"kafka_share_workers_{key}_total", group) == \
                summary.totals[key], (key, str(summary))
        connect_report(f"worker metrics over Connect: {summary.totals['accepted']} accepted")
    finally:
        if not job.done:
            job.stop("the test is done", grace_s=120)
        server.shutdown()
        server.server_close()


def test_the_query_metrics_from_a_connect_client(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, tmp_path: Path,
    connect_spark: SparkSession, connect_report: Callable[[str], None],
) -> None:
    topic = topic_factory(2)
    expected = produce_spread(kafka, topic, 2, 400)
    server, metrics = serve_query_metrics(connect_spark, 0, "127.0.0.1", poll_interval_s=0.5)
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    q = (("query", "metered"),)
    df = share_stream(connect_spark, kafka, topic, group, tmp_path / "journal",
                      startingOffsets="earliest", maxRecordsPerTrigger=200, numPartitions=2)
    query = (df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "chk")).queryName("metered")
             .trigger(processingTime="500 milliseconds").start())
    try:
        seen = wait_for(lambda: scrape(url), lambda s: s.get(
            ("kafka_share_query_batch_records_total", q)) == 400, timeout_s=180,
            what="400 records counted from the polled progress")
        assert seen[("kafka_share_query_input_rows_total", q)] == 400
        assert seen[("kafka_share_query_active", q)] == 1
    finally:
        query.stop()
    ended = wait_for(lambda: scrape(url), lambda s: s.get(("kafka_share_query_active", q)) == 0,
                     timeout_s=30, what="the stopped query marked terminated")
    assert ("kafka_share_query_lag", q) not in ended
    metrics.close()
    server.shutdown()
    server.server_close()
    assert_exactly_once(sink_keys(connect_spark, tmp_path / "out"), expected)
    connect_report("query metrics over Connect (polled): 400 records counted once")
