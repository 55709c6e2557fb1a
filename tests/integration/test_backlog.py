"""Source behaviour driven by the share group's backlog, and the per-batch metrics."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from pyspark_kafka_share.harness import LocalKafka
from tests.fixtures.kafka import TopicFactory
from tests.helpers import share_stream, wait_for


def _stream(spark: SparkSession, kafka: LocalKafka, topic: str, group: str,
            journal: Path) -> DataFrame:
    return share_stream(spark, kafka, topic, group, journal, numPartitions=2, pollTimeoutMs=1000)


def _report(progress: Any) -> dict[str, Any]:
    return dict(json.loads(progress.sources[0].latestOffset or "{}"))


def test_lag_falls_to_zero_and_metrics_add_up(
    spark: SparkSession, kafka: LocalKafka, topic_factory: TopicFactory, group: str, tmp_path: Path
) -> None:
    topic = topic_factory(2)
    kafka.produce(topic, (b"%d" % i for i in range(3000)))
    q = (_stream(spark, kafka, topic, group, tmp_path / "j").writeStream.format("noop")
         .option("checkpointLocation", str(tmp_path / "c")).start())
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            reports = [_report(p) for p in q.recentProgress]
            if reports and reports[-1].get("lag") == 0 and \
                    sum(r["lastBatch"].get("records", 0) for r in reports) >= 3000:
                break
            time.sleep(1)
    finally:
        q.stop()
    reports = [_report(p) for p in q.recentProgress]
    lags = [r["lag"] for r in reports if r.get("lag") is not None]
    assert lags and lags[-1] == 0, f"lag never reached 0: {lags}"
    assert all(v == 0 for v in reports[-1]["lagByPartition"].values())
    batches = {r["lastBatch"]["batch"]: r["lastBatch"] for r in reports if r["lastBatch"]}
    assert sum(b.get("records", 0) for b in batches.values()) == 3000
    assert sum(b.get("accepted", 0) for b in batches.values()) == 3000
    assert sum(b.get("records_acquired", 0) for b in batches.values()) == 3000
    rows = sum(p.numInputRows for p in q.recentProgress)
    assert rows == 3000


def test_no_empty_micro_batches_while_the_queue_is_empty(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path
) -> None:
    kafka.produce(topic, [b"first"])
    q = (_stream(spark, kafka, topic, group, tmp_path / "j").writeStream.format("noop")
         .option("checkpointLocation", str(tmp_path / "c")).start())
    try:
        # The record read and the source's lag known to be 0 (its last progress says so), not
        # a fixed pause: until then an empty batch asking for the lag is the source's right.
        wait_for(lambda: [(p.numInputRows, _report(p).get("lag")) for p in q.recentProgress],
                 lambda ps: sum(n for n, _ in ps) >= 1 and ps[-1][1] == 0, 120,
                 "the record read and the source's lag at 0")

        def empty_batches() -> set[int]:
            """Batches that ran (an idle trigger's progress has no addBatch), reading nothing."""
            return {p.batchId for p in q.recentProgress
                    if p.numInputRows == 0 and "addBatch" in p.durationMs}

        idle_from, empty_before = max(p.batchId for p in q.recentProgress), empty_batches()
        # The test's point is that time passes with nothing to read: the window is a sleep.
        # On a loaded machine fewer triggers fit in it, which can hide a fault but not fail a
        # correct source.
        time.sleep(8)
        idle_to = max(p.batchId for p in q.recentProgress)
        # An empty batch with an unknown lag takes ~8.5 s: the batch ids alone could miss one.
        empty_during = empty_batches() - empty_before
        assert idle_to - idle_from <= 1 and not empty_during, \
            f"batches {idle_from}..{idle_to} ran while the queue was empty, empty ones " \
            f"{sorted(empty_during)}"
        kafka.produce(topic, [b"second"])
        deadline = time.monotonic() + 60
        while sum(p.numInputRows for p in q.recentProgress) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert sum(p.numInputRows for p in q.recentProgress) == 2, "new data was not read"
    finally:
        q.stop()
