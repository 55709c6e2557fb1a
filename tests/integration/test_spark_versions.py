"""What differs between PySpark lines: the source plans, caps and reports on every line.

Spark 4.2+ drives the source through its admission-control API (``latestOffset(start,
limit)``, ``ReadMaxRows``, ``reportLatestOffset``); 4.0 and 4.1 call ``latestOffset()`` with
no arguments, so the source caps batches itself and reports its metrics in the offset. These
tests run on both (``make test`` on the newest line, ``make test-versions`` on 4.0 and 4.1).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from pyspark_kafka_share._spark import ADMISSION_CONTROL
from pyspark_kafka_share.harness import LocalKafka


def _sink_keys(spark: SparkSession, out: Path) -> list[tuple[int, int]]:
    # The sink lists its files in _spark_metadata: none there until a batch commits.
    if not any((out / "_spark_metadata").glob("[0-9]*")):
        return []
    return [(r.partition, r.offset)
            for r in spark.read.parquet(str(out)).select("partition", "offset").collect()]


def _source_report(progress: Any) -> dict[str, Any]:
    """The source's lag and last-batch metrics, wherever this Spark line shows them."""
    # From the progress's JSON: PySpark 4.0's SourceProgress shows offsets as Python reprs.
    source = json.loads(progress.json)["sources"][0]
    report = source["latestOffset" if ADMISSION_CONTROL else "endOffset"]
    if isinstance(report, str):
        report = json.loads(report)
    assert isinstance(report, dict), source
    return report


@pytest.mark.spark_subset
def test_max_records_per_trigger_caps_every_batch_and_progress_reports_lag(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path
) -> None:
    # One record per producer batch: the broker acquires whole batches, so the cap is exact.
    kafka.produce(topic, (b"%d" % i for i in range(600)),
                  producer_config={"batch.size": "1", "linger.ms": "0"})
    df = (spark.readStream.format("kafka-share")
          .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
          .option("kafka.group.id", group).option("subscribe", topic)
          .option("journalPath", str(tmp_path / "journal")).option("numPartitions", 2)
          .option("maxRecordsPerTrigger", 100).option("pollTimeoutMs", 1500).load())
    out = tmp_path / "out"
    q = (df.writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(tmp_path / "chk"))
         .trigger(processingTime="200 milliseconds").start())
    try:
        deadline = time.monotonic() + 240
        while len(_sink_keys(spark, out)) < 600 and time.monotonic() < deadline:
            assert q.exception() is None, q.exception()
            time.sleep(1)
    finally:
        q.stop()
    sizes = [p.numInputRows for p in q.recentProgress if p.numInputRows]
    assert sizes and max(sizes) <= 100, sizes
    got = _sink_keys(spark, out)
    assert not [k for k, c in Counter(got).items() if c > 1], "a record landed twice"
    assert set(got) == {(0, o) for o in range(600)}
    reports = [_source_report(p) for p in q.recentProgress if p.numInputRows]
    assert all("lag" in r and "lastBatch" in r for r in reports), reports[:2]
    assert any(r["lastBatch"].get("records") for r in reports), \
        "no batch reported the metrics of the batch before it"
