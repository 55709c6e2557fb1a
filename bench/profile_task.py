"""Where one kafka-share task's time goes: the executor-side reader under cProfile, no Spark.

    python bench/profile_task.py [--records N] [--delivery exactly-once|at-most-once]
                                 [--content offsets|records]

Produces N records (200-byte values) to a 1-partition topic on an embedded broker, then runs
``read_partition`` in this process, exactly as a Spark task would (pooled share consumer,
journal in a temp dir), and prints: the raw client drain rate for comparison, the task's rate
after its consumer joined, and the functions that took the time (cumulative).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _contenders import produce_dataset

from pyspark_kafka_share._kafka import pool as _pool
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share.harness import LocalKafka
from pyspark_kafka_share.source.options import parse_options
from pyspark_kafka_share.source.task import TaskSpec, read_partition


def _group(kafka: LocalKafka) -> str:
    group = f"prof-{uuid.uuid4().hex[:8]}"
    kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
    return group


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--delivery", default="exactly-once")
    ap.add_argument("--content", default="offsets", help="journalContent (exactly-once)")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    with LocalKafka() as kafka:
        topic = produce_dataset(kafka, "prof", 1, args.records)[0].topic
        # Warm the broker's share coordinator (its first group pays a one-off few seconds).
        warm = parse_options({"kafka.bootstrap.servers": kafka.bootstrap_servers,
                              "kafka.group.id": _group(kafka), "subscribe": topic,
                              "delivery": "at-most-once", "maxRecordsPerTrigger": "1"})
        list(read_partition(TaskSpec(warm, 0, 0, 1, task_max_records=1, lock_ms=30_000)))
        _pool.close_all()

        opts = parse_options({
            "kafka.bootstrap.servers": kafka.bootstrap_servers, "kafka.group.id": _group(kafka),
            "subscribe": topic, "delivery": args.delivery,
            "journalPath": tempfile.mkdtemp(prefix="prof-journal-"),
            "journalContent": args.content,
            "maxBatchDurationMs": "600000"})
        spec = TaskSpec(opts, seq=0, part=0, parts=1, task_max_records=args.records,
                        lock_ms=30_000, partitions=(TopicPartition(topic, 0),))
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        rows = sum(b.num_rows for b in read_partition(spec))
        profiler.disable()
        took = time.perf_counter() - start
        _pool.close_all()
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("cumulative").print_stats(args.top)
        print(f"{args.delivery} (journalContent={args.content}): {rows} rows in {took:.2f}s = "
              f"{rows / took:,.0f} rows/s "
              "(one task, one consumer, including its group join; the profile adds overhead)")
        print(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
