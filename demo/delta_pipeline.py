"""kafka-share -> from_json -> a Delta Lake table, exactly once (docs/examples.md).

With ``--bootstrap-server``, the pipeline alone: it reads the share group until its lag reads 0
(``pyspark_kafka_share.progress``, a processing-time trigger: the same on every Spark line),
then prints the table's counts as one JSON line. Without it, the demo (``make demo
SINK=delta``): a local broker, 20,000 JSON orders on 3 partitions, the pipeline, the counts.

Needs delta-spark in the version that fits this PySpark (docs/examples.md):
``configure_spark_with_delta_pip`` fetches the Delta jars from Maven Central on first use.
The checkpoint, the journal and the table belong to this one query; run it again and it
resumes where it stopped, also after ``kill -9``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # before the SparkSession

SCHEMA = "id LONG, customer STRING, amount DOUBLE"


def delta_session(app: str) -> Any:
    """A local SparkSession with Delta Lake (its jars fetched by Ivy on first use, from Maven
    Central into the package's cache: :func:`~pyspark_kafka_share.harness.jars.ivy_settings`)."""
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession

    from pyspark_kafka_share.harness.jars import ivy_settings

    builder = (SparkSession.builder.master("local[2]").appName(app)
               .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
               .config("spark.sql.catalog.spark_catalog",
                       "org.apache.spark.sql.delta.catalog.DeltaCatalog")
               .config("spark.sql.shuffle.partitions", "2")
               # Delta rebuilds a table's snapshot with 50 tasks by default: slow on a laptop.
               .config("spark.databricks.delta.snapshotPartitions", "2")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.ui.enabled", "false"))
    for key, value in ivy_settings().items():  # Maven Central only: no ~/.m2 entry breaks it
        builder = builder.config(key, value)
    return configure_spark_with_delta_pip(builder).getOrCreate()


def start_pipeline(spark: Any, args: argparse.Namespace) -> Any:
    """The README's source, parsed with from_json, appended to a Delta table."""
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("kafka-share")
              .option("kafka.bootstrap.servers", args.bootstrap_server)
              .option("kafka.group.id", args.group)
              .option("subscribe", args.topic)
              .option("startingOffsets", "earliest")
              .option("journalPath", args.journal))
    if args.max_records_per_trigger:
        reader = reader.option("maxRecordsPerTrigger", args.max_records_per_trigger)
    for key, value in (kv.split("=", 1) for kv in args.option):
        reader = reader.option(key, value)
    orders = (reader.load()
              .select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("o"),
                      "topic", "partition", "offset")
              .select("o.*", "topic", "partition", "offset"))
    return (orders.writeStream.format("delta").outputMode("append")
            .option("checkpointLocation", args.checkpoint)
            .trigger(processingTime="1 second")
            .start(args.table))


def run_until_drained(query: Any, timeout_s: float) -> None:
    """Stop the query once the source reports lag 0 (docs/operations.md)."""
    import pyspark_kafka_share as ks

    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if query.exception() is not None:
                raise RuntimeError(f"the query failed: {query.exception()}")
            p = ks.progress(query)
            if p is not None and p.lag == 0:
                return
            time.sleep(1)
        raise TimeoutError(f"the lag did not read 0 within {timeout_s:.0f} s")
    finally:
        query.stop()


def table_counts(spark: Any, table: str) -> dict[str, int]:
    """Rows, distinct Kafka records and distinct order ids in the Delta table."""
    from pyspark.sql import functions as F

    row = spark.read.format("delta").load(table).agg(
        F.count("*").alias("rows"),
        F.count_distinct("topic", "partition", "offset").alias("records"),
        F.count_distinct("id").alias("ids")).first()
    return {key: int(row[key]) for key in ("rows", "records", "ids")}


def _produce_demo_orders(kafka: Any, topic: str, count: int) -> None:
    kafka.create_topic(topic, 3)
    kafka.produce(topic, (json.dumps({"id": i, "customer": f"c{i % 97}",
                                      "amount": round(i * 0.25, 2)}).encode()
                          for i in range(count)))


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap-server", help="the broker (default: a local one, the demo)")
    ap.add_argument("--topic", default="orders")
    ap.add_argument("--group", default="orders-to-delta")
    ap.add_argument("--dir", default=None,
                    help="where the table, checkpoint and journal live (default: a new "
                         "temporary directory)")
    ap.add_argument("--max-records-per-trigger", type=int, default=None)
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="another source option (repeatable)")
    ap.add_argument("--timeout", type=float, default=600, metavar="SECONDS")
    args = ap.parse_args(argv)
    base = Path(args.dir or tempfile.mkdtemp(prefix="kafka-share-delta-"))
    args.table, args.checkpoint, args.journal = (str(base / n) for n in
                                                 ("table", "checkpoint", "journal"))
    return args


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.bootstrap_server is None:
        from pyspark_kafka_share.harness import LocalKafka

        with LocalKafka() as kafka:
            args.bootstrap_server = kafka.bootstrap_servers
            _produce_demo_orders(kafka, args.topic, 20_000)
            print(f"broker {kafka.bootstrap_servers}: 20000 orders on {args.topic}", flush=True)
            return _pipeline(args)
    return _pipeline(args)


def _pipeline(args: argparse.Namespace) -> int:
    spark = delta_session("kafka-share-to-delta")
    try:
        run_until_drained(start_pipeline(spark, args), args.timeout)
        print(json.dumps({"table": args.table, **table_counts(spark, args.table)}), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
