"""The docs' progress recipe on every Spark line (docs/operations.md, "Watching a query"):
``pyspark_kafka_share.progress(query)`` gives the lag and the last batch's counters, and the
lag reads 0 once the group is drained, also on Spark 4.0/4.1, where the source refreshes its
report with one empty micro-batch. And one Trigger.AvailableNow run over 50,000 records: it
drains them (4.2+) or warns at start (4.0/4.1). Run by ``make test`` (newest line) and
``make test-versions`` (4.0, 4.1)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import pyspark_kafka_share as ks
from pyspark_kafka_share.harness import LocalKafka


def _rows(spark: Any, out: Path) -> int:
    if not any((out / "_spark_metadata").glob("[0-9]*")):
        return 0
    return int(spark.read.parquet(str(out)).count())


@pytest.mark.spark_subset
def test_progress_recipe_shows_last_batch_and_lag_zero_once_drained(
    spark: Any, kafka: LocalKafka, topic_factory: Any, group: str, tmp_path: Path
) -> None:
    topic = topic_factory(2)
    kafka.produce(topic, (b"%d" % i for i in range(400)))
    df = (spark.readStream.format("kafka-share")
          .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
          .option("kafka.group.id", group).option("subscribe", topic)
          .option("startingOffsets", "earliest")
          .option("journalPath", str(tmp_path / "journal")).option("numPartitions", 2)
          .option("pollTimeoutMs", 1500).load())
    out = tmp_path / "out"
    query = (df.writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(tmp_path / "chk"))
             .trigger(processingTime="500 milliseconds").start())
    seen: list[ks.SourceProgress] = []
    try:
        # The docs' recipe: poll progress(query) until the lag reads 0.
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert query.exception() is None, query.exception()
            p = ks.progress(query)
            if p is not None:
                seen.append(p)
                if p.lag == 0 and p.last_batch.get("records"):
                    break
            time.sleep(0.5)
        rows = _rows(spark, out)
    finally:
        query.stop()
    assert seen, "no progress with a kafka-share report"
    last = seen[-1]
    assert last.lag == 0, f"the lag never read 0: {seen[-3:]}"
    assert set(last.lag_by_partition) == {f"{topic}:0", f"{topic}:1"}
    assert all(v == 0 for v in last.lag_by_partition.values()), last
    # Lag 0 is read after the batches that took the records committed: all 400 are there.
    assert rows == 400, rows
    assert last.last_batch["batch"] >= 1 and last.last_batch["records"] >= 1, last
    assert last.last_batch["accepted"] >= last.last_batch["records"], last
    # The reports of the data batches showed the backlog they read.
    reports = [ks.progress(x) for x in query.recentProgress]
    assert any(r is not None and r.lag for r in reports), reports


@pytest.mark.spark_subset
def test_progress_recipe_available_now_runs_until_lag_zero_are_exactly_once(
    spark: Any, kafka: LocalKafka, topic_factory: Any, group: str, tmp_path: Path
) -> None:
    # Spark 4.0/4.1 run ONE micro-batch per Trigger.AvailableNow run (docs/options.md): the
    # documented fix repeats runs until progress() reads lag 0 or no rows; on 4.2+ the first
    # run drains (and a second run, with nothing to read, reports lag 0).
    topic = topic_factory(2)
    kafka.produce(topic, (b"%d" % i for i in range(900)),
                  producer_config={"batch.size": "1", "linger.ms": "0"})
    out = tmp_path / "out"
    runs = []
    for _ in range(8):
        df = (spark.readStream.format("kafka-share")
              .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
              .option("kafka.group.id", group).option("subscribe", topic)
              .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", 400)
              .option("journalPath", str(tmp_path / "journal")).option("numPartitions", 2)
              .option("pollTimeoutMs", 1500).load())
        query = (df.writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(tmp_path / "chk"))
                 .trigger(availableNow=True).start())
        assert query.awaitTermination(240), "an AvailableNow run did not end"
        assert query.exception() is None, query.exception()
        p = ks.progress(query)
        runs.append(p)
        if p is not None and (p.lag == 0 or p.input_rows == 0):
            break
    # 4.2+: lag 0; 4.0/4.1: a run that found nothing to read planned no batch (its progress
    # repeats the checkpoint's last report, docs/options.md).
    assert runs[-1] is not None and (runs[-1].lag == 0 or runs[-1].input_rows == 0), runs
    keys = [(r.partition, r.offset)
            for r in spark.read.parquet(str(out)).select("partition", "offset").collect()]
    assert len(keys) == 900 and len(set(keys)) == 900, (len(keys), len(set(keys)), runs)


# One run of Trigger.AvailableNow in a process of its own, as a user starts it: on Spark < 4.2
# the source's reader runs in a Python process Spark starts, whose stderr (the WARNING) is the
# driver's console. Prints the rows the run wrote.
_AVAILABLE_NOW_RUN = """
import sys
from pyspark_kafka_share.harness import local_spark
bootstrap, topic, group, base = sys.argv[1:5]
spark = local_spark("local[2]", "available-now-once")
df = (spark.readStream.format("kafka-share").option("kafka.bootstrap.servers", bootstrap)
      .option("kafka.group.id", group).option("subscribe", topic)
      .option("startingOffsets", "earliest").option("journalPath", base + "/journal").load())
q = (df.writeStream.format("parquet").option("path", base + "/out")
     .option("checkpointLocation", base + "/chk").trigger(availableNow=True).start())
q.awaitTermination(600)
assert q.exception() is None, q.exception()
print(spark.read.parquet(base + "/out").select("partition", "offset").distinct().count(),
      spark.read.parquet(base + "/out").count())
"""


@pytest.mark.spark_subset
def test_available_now_drains_50000_records_in_one_run_or_warns_at_start(
    kafka: LocalKafka, topic_factory: Any, group: str, tmp_path: Path
) -> None:
    """Issue 25's promise: one Trigger.AvailableNow run over 50,000 waiting records reads them
    all (Spark 4.2+) or, where Spark gives Python sources no AvailableNow (4.0/4.1), says so at
    start, naming the records waiting and the fix; what it read is there once."""
    import subprocess
    import sys

    from pyspark_kafka_share._spark import ADMISSION_CONTROL

    # 50,000 where AvailableNow drains; the warning at start needs no more than a few polls.
    waiting = 50_000 if ADMISSION_CONTROL else 5_000
    topic = topic_factory(3)
    kafka.produce(topic, (b"%d" % i for i in range(waiting)))
    done = subprocess.run([sys.executable, "-c", _AVAILABLE_NOW_RUN, kafka.bootstrap_servers,
                           topic, group, str(tmp_path)],
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    distinct, rows = (int(n) for n in done.stdout.split()[-2:])
    assert distinct == rows, (distinct, rows)  # nothing twice
    warning = f"share group {group!r} has {waiting} records waiting at this query's start"
    if ADMISSION_CONTROL:
        assert rows == 50_000, rows
        assert warning not in done.stderr
    else:
        assert warning in done.stderr, done.stderr[-3000:]
        assert "has no Trigger.AvailableNow for Python sources" in done.stderr
        assert "progress(query).lag == 0" in done.stderr  # the fix
        assert 0 < rows <= waiting, rows
