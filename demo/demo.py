"""make demo: the kafka-share source end to end on an embedded Kafka broker.

1. start a local Kafka broker (real Apache Kafka, share groups on);
2. produce sample orders to a 2-partition topic;
3. run a Structured Streaming query, readStream.format("kafka-share") with 4 tasks (more
   consumers than partitions), exactly-once into a Parquet table, Trigger.AvailableNow;
4. print progress, what landed per Kafka partition and per Spark task, and verify it against
   what was produced: every record exactly once.

The journal is a local directory under demo-output/; with ``--journal s3`` (``make demo
JOURNAL=s3``, or ``DEMO_JOURNAL=s3``) it lives on a local S3 server instead (moto, started on
127.0.0.1 by ``LocalS3``), reached through ``journal.*`` options.

The demo prints only its own lines: the log lines of the Kafka clients, Spark (its JVM and
Python workers) and the broker go to demo-output/demo.log (see ``_quiet.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from _quiet import logs_to_file

from pyspark_kafka_share.harness import LocalKafka, ProducerRecord, local_spark

RECORDS = 20_000
TOPIC_PARTITIONS = 2
TASKS = 4
OUT = Path(__file__).resolve().parent.parent / "demo-output"


def main() -> int:
    ap = argparse.ArgumentParser(description="the kafka-share source end to end")
    ap.add_argument("--journal", choices=("local", "s3"),
                    default=os.environ.get("DEMO_JOURNAL") or "local",
                    help="where the journal lives (default: $DEMO_JOURNAL or local)")
    args = ap.parse_args()
    shutil.rmtree(OUT, ignore_errors=True)
    with logs_to_file(OUT / "demo.log") as log, LocalKafka() as kafka, \
            contextlib.ExitStack() as stack:
        print(f"      (log lines of the Kafka clients, Spark and the broker: {log})")
        journal: tuple[str, dict[str, str]] = (str(OUT / "journal"), {})
        if args.journal == "s3":
            from pyspark_kafka_share.harness.s3 import LocalS3

            s3 = stack.enter_context(LocalS3())
            s3.create_bucket("demo-journal")
            journal = ("s3://demo-journal/orders", s3.journal_options())
            print(f"      journal on a local S3 server at {s3.endpoint_url}: {journal[0]}")
        print(f"[1/4] Kafka broker up at {kafka.bootstrap_servers}")
        kafka.create_topic("orders", partitions=TOPIC_PARTITIONS)
        kafka.set_group_config("order-processors", "share.auto.offset.reset", "earliest")
        kafka.produce("orders", (
            ProducerRecord(key=f"customer-{i % 97}".encode(),
                           value=json.dumps({"order": i, "amount": i % 500}).encode(),
                           partition=i % TOPIC_PARTITIONS)
            for i in range(RECORDS)), producer_config={"batch.size": "16384"})
        print(f"[2/4] produced {RECORDS} orders to topic 'orders' ({TOPIC_PARTITIONS} "
              "partitions)")
        return _run_query(kafka, journal)


def _run_query(kafka: LocalKafka, journal: tuple[str, dict[str, str]]) -> int:
    from pyspark.sql.functions import col, get_json_object, spark_partition_id

    # UI and console progress off (local_spark), Python workers run this interpreter.
    spark = local_spark("local[2, 4]", "kafka-share-demo", log_level="ERROR")
    try:
        orders = (
            spark.readStream.format("kafka-share")
            .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
            .option("kafka.group.id", "order-processors")
            .option("subscribe", "orders")
            .option("journalPath", journal[0])
            .options(**journal[1])
            .option("numPartitions", TASKS)
            .option("maxRecordsPerTrigger", 6000)
            .load()
            .select("topic", "partition", "offset", "deliveryCount",
                    get_json_object(col("value").cast("string"), "$.amount")
                    .cast("int").alias("amount"),
                    spark_partition_id().alias("task"))
        )
        print(f"[3/4] streaming into {OUT / 'orders'} with {TASKS} tasks "
              f"(> {TOPIC_PARTITIONS} partitions), exactly-once, Trigger.AvailableNow")
        query = (orders.writeStream.format("parquet")
                 .option("path", str(OUT / "orders"))
                 .option("checkpointLocation", str(OUT / "checkpoint"))
                 .trigger(availableNow=True).start())
        finish_progress = _print_progress(query)
        query.awaitTermination()
        finish_progress()
        return _verify(spark)
    finally:
        spark.stop()


def _print_progress(query: object) -> Callable[[], None]:
    """Print each batch's progress as it ends; returns the function that prints the rest
    (call it after the query terminated: its last batch ends after ``isActive`` turns off)."""
    seen: set[int] = set()
    lock = threading.Lock()

    def report_new() -> None:
        with lock:
            for p in query.recentProgress:  # type: ignore[attr-defined]
                if p.batchId not in seen:
                    seen.add(p.batchId)
                    print(f"      batch {p.batchId}: {p.numInputRows} rows "
                          f"({p.processedRowsPerSecond:.0f} rows/s)", flush=True)

    def report() -> None:
        while query.isActive:  # type: ignore[attr-defined]
            report_new()
            time.sleep(0.5)

    thread = threading.Thread(target=report, daemon=True)
    thread.start()

    def finish() -> None:
        thread.join()
        report_new()

    return finish


def _verify(spark: object) -> int:
    rows = spark.read.parquet(str(OUT / "orders")).collect()  # type: ignore[attr-defined]
    per_partition = Counter(r.partition for r in rows)
    per_task = Counter(r.task for r in rows)
    keys = Counter((r.partition, r.offset) for r in rows)
    expected = {(i % TOPIC_PARTITIONS, i // TOPIC_PARTITIONS) for i in range(RECORDS)}
    print("[4/4] landed in the Parquet table:")
    for p in sorted(per_partition):
        print(f"      Kafka partition {p}: {per_partition[p]} records")
    for t in sorted(per_task):
        print(f"      Spark task {t}: {per_task[t]} records")
    dups = sum(c - 1 for c in keys.values() if c > 1)
    lost = len(expected - set(keys))
    total = sum(r.amount for r in rows)
    print(f"      total amount {total}; duplicates {dups}; lost {lost}")
    if dups or lost or set(keys) != expected:
        print("FAILED: the table does not hold every produced record exactly once")
        return 1
    print(f"OK: all {RECORDS} records landed exactly once")
    return 0


if __name__ == "__main__":
    sys.exit(main())
