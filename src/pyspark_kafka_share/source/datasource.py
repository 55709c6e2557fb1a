"""The ``kafka-share`` Structured Streaming source (PySpark Python Data Source API).

Driver side: :class:`KafkaShareDataSource` validates options and the broker at ``load()``;
:class:`KafkaShareStreamReader` plans micro-batches. Offsets carry no Kafka positions (a share
group keeps those on the broker); an offset is ``{"seq": n, "parts": p, "max": m}``: batch
``n`` runs ``p`` tasks reading at most ``m`` records in all (0 = unlimited). Spark writes the
offset to its log before running the batch, so a re-run batch gets the same tasks, and each
task finds its records in the journal under ``(seq, part)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pyspark_kafka_share._kafka.arrow import spark_schema_ddl
from pyspark_kafka_share._kafka.group import Backlog, read_backlog
from pyspark_kafka_share.source.options import SourceOptions, parse_options
from pyspark_kafka_share.source.task import TaskSpec, read_partition

__all__ = ["KafkaShareDataSource", "KafkaShareStreamReader"]


class KafkaSharePartition(InputPartition):
    """One task of one micro-batch."""

    def __init__(self, spec: TaskSpec) -> None:
        super().__init__(spec.part)
        self.spec = spec


class KafkaShareDataSource(DataSource):
    """``spark.readStream.format("kafka-share")``: see docs/options.md."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.parsed: SourceOptions = parse_options(options)

    @classmethod
    def name(cls) -> str:
        return "kafka-share"

    def schema(self) -> str:
        # Called at load(): fail there, before any query starts, if the broker is unusable.
        from pyspark_kafka_share._kafka.group import inspect_broker

        inspect_broker(self.parsed)
        return spark_schema_ddl(self.parsed.include_headers)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaShareStreamReader(self.parsed)


class KafkaShareStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans micro-batches on the driver; ``read`` runs on executors."""

    def __init__(self, options: SourceOptions) -> None:
        from pyspark_kafka_share._kafka.group import inspect_broker, set_starting_offsets

        self.options = options
        facts = inspect_broker(options)
        if options.journal_path is not None:
            self._check_lock(facts.lock_ms)
        set_starting_offsets(options)
        self.lock_ms = facts.lock_ms
        self.delivery_limit = facts.delivery_limit
        self.num_partitions = options.num_partitions or max(1, sum(facts.partitions.values()))
        self.available_now_target: dict[str, int] | None = None
        self.available_now_first_seq: int | None = None  # first batch this run plans
        self.backlog: Backlog | None = None  # read at the last latestOffset
        self.last_batch: dict[str, int] = {}  # metrics of the last finished batch

    def _check_lock(self, lock_ms: int) -> None:
        from pyspark_kafka_share.errors import OptionError

        budget = lock_ms * self.options.lock_safety_fraction
        if budget < 200:
            raise OptionError(
                "lockSafetyFraction", self.options.lock_safety_fraction,
                f"the group's share.record.lock.duration.ms is {lock_ms} ms, leaving "
                f"{budget:.0f} ms to journal each poll; raise the lock duration",
            )

    # -- offsets -----------------------------------------------------------------------

    def initialOffset(self) -> dict[str, int]:
        # Called for a query without committed batches: a journal that records committed
        # batches belongs to another query (or to this one before its checkpoint was reset),
        # and batch numbers would collide with them.
        if self.options.journal_path is not None:
            from pyspark_kafka_share.errors import OptionError
            from pyspark_kafka_share.source.journal.journal import Journal

            used = Journal(self.options.journal_path, fsync=self.options.journal_fsync).in_use()
            if used is not None:
                raise OptionError(
                    "journalPath", self.options.journal_path,
                    f"this query has no committed batch, but the journal was used before "
                    f"({used}). Give every query its own journal, like its checkpoint; if the "
                    "old query is gone for good, delete the directory",
                )
        return {"seq": 0, "parts": self.num_partitions, "max": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_trigger:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        self._collect_metrics(start)
        self.backlog = read_backlog(self.options)
        if self.backlog.empty:
            return start  # nothing to read: no (empty) micro-batch
        if self.available_now_target is not None:
            if self.available_now_first_seq is None:
                # A restarted query's previous batches say nothing about this run's target.
                self.available_now_first_seq = int(start["seq"]) + 1
            elif self._drained(start):
                return start
        max_rows = int(limit.max_rows) if isinstance(limit, ReadMaxRows) else 0
        return {"seq": int(start["seq"]) + 1, "parts": self.num_partitions, "max": max_rows}

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Shown as ``latestOffset`` of this source in ``StreamingQueryProgress``: the group's
        backlog (lag) and the metrics of the last finished batch (see docs/operations.md)."""
        report: dict[str, Any] = {"lastBatch": self.last_batch}
        if self.backlog is not None:
            report["lag"] = self.backlog.total
            report["lagByPartition"] = self.backlog.by_partition
        return report

    def _collect_metrics(self, start: dict[str, int]) -> None:
        """Sum the END-marker stats of batch ``start`` (the one that just finished)."""
        seq = int(start["seq"])
        if seq <= 0 or self.options.journal_path is None or \
                self.last_batch.get("batch") == seq:
            return
        from pyspark_kafka_share.source.journal.journal import Journal

        totals: dict[str, int] = {"batch": seq}
        ends = Journal(self.options.journal_path, fsync=self.options.journal_fsync).batch_ends(seq)
        for end in ends.values():
            totals["records"] = totals.get("records", 0) + end.records
            for key, value in end.stats.items():
                if key == "join_ms":
                    totals["consumer_joins"] = totals.get("consumer_joins", 0) + 1
                    totals["max_join_ms"] = max(totals.get("max_join_ms", 0), value)
                else:
                    totals[key] = totals.get(key, 0) + value
        self.last_batch = totals

    def prepareForTriggerAvailableNow(self) -> None:
        from pyspark_kafka_share._kafka.group import latest_offsets
        from pyspark_kafka_share.errors import OptionError

        if self.options.journal_path is None:
            raise OptionError(
                "journalPath", None,
                "Trigger.AvailableNow needs journalPath (also with delivery=at-most-once): the "
                "source learns from the journal when the backlog present at start is read",
            )
        self.available_now_target = latest_offsets(self.options)

    def _drained(self, start: dict[str, int]) -> bool:
        """True when batch ``start`` acquired nothing that was in the topics at AvailableNow
        start (neither emitted nor released), judged from every task's END marker."""
        from pyspark_kafka_share.source.journal.journal import Journal

        seq = int(start["seq"])
        first = self.available_now_first_seq
        if first is None or seq < first or self.options.journal_path is None \
                or self.available_now_target is None:
            return False
        ends = Journal(self.options.journal_path, fsync=self.options.journal_fsync).batch_ends(seq)
        if len(ends) < int(start["parts"]):
            return False  # a task without END cannot have finished; do not stop on it
        target = self.available_now_target
        for end in ends.values():
            for tp, low in end.min_offsets.items():
                if low < target.get(tp, 0):
                    return False
        return True

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        parts = int(end["parts"])
        total = int(end.get("max", 0))
        per_task = math.ceil(total / parts) if total else None
        return [
            KafkaSharePartition(TaskSpec(options=self.options, seq=int(end["seq"]), part=i,
                                         parts=parts, max_records=per_task,
                                         lock_ms=self.lock_ms,
                                         delivery_limit=self.delivery_limit,
                                         topic_partitions=self._topic_partitions()))
            for i in range(parts)
        ]

    def _topic_partitions(self) -> int | None:
        """Partitions of the subscribed topics, as the last backlog read saw them."""
        if self.backlog is None or not self.backlog.by_partition:
            return None
        return len(self.backlog.by_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaSharePartition)
        return read_partition(partition.spec)

    def commit(self, end: dict[str, int]) -> None:
        if self.options.journal_path is None:
            return
        from pyspark_kafka_share._kafka.group import read_start_offsets
        from pyspark_kafka_share.source.journal.journal import Journal

        Journal(self.options.journal_path, fsync=self.options.journal_fsync).commit(
            int(end["seq"]), self.options.dedup_retention_ms,
            read_start_offsets(self.options))

    def stop(self) -> None:
        """Spark may never call this; nothing depends on it."""
