"""The ``kafka-share`` Structured Streaming source (PySpark Python Data Source API).

Driver side: :class:`KafkaShareDataSource` validates options and the broker at ``load()``;
:class:`KafkaShareStreamReader` plans micro-batches as :class:`BatchOffset`s (see
``offset.py``), and ``read`` hands each task to the executors (``task.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from pyspark_kafka_share._kafka.arrow import spark_schema_ddl
from pyspark_kafka_share._kafka.group import (
    Backlog,
    inspect_broker,
    latest_offsets,
    read_backlog,
    read_start_offsets,
    set_group_configs,
)
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._spark import ADMISSION_CONTROL
from pyspark_kafka_share.errors import OptionError, UnknownTopicError
from pyspark_kafka_share.source.journal.journal import Journal
from pyspark_kafka_share.source.notices import available_now_notice, oversized_batch_notice
from pyspark_kafka_share.source.offset import (
    EXACTLY_ONCE_POLLS_PER_SHARE,
    POLLS_PER_SHARE,
    BatchOffset,
)
from pyspark_kafka_share.source.options import SourceOptions, parse_options
from pyspark_kafka_share.source.task import TaskSpec, read_partition

if TYPE_CHECKING or ADMISSION_CONTROL:  # Spark >= 4.2
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

__all__ = ["KafkaShareDataSource", "KafkaShareStreamReader"]

REFRESH = "refresh"  # the key that marks an offset of _idle (Spark < 4.2)
_LOG = logging.getLogger("pyspark_kafka_share.source")
# The reader runs in a Python process that Spark starts, where no application configures
# logging: its notices go to that process's stderr, which Spark shows as its own.
if not _LOG.handlers:
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(asctime)s WARN kafka-share: %(message)s",
                                            "%y/%m/%d %H:%M:%S"))
    _LOG.addHandler(_handler)
    _LOG.propagate = False


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
        opts = self.parsed
        inspect_broker(opts.client, opts.topics)
        if opts.starting_offsets is not None:  # may it? (set when the query starts)
            set_group_configs(opts.client, {"share.auto.offset.reset": opts.starting_offsets},
                              option="startingOffsets", validate_only=True)
        return spark_schema_ddl(self.parsed.include_headers)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if ADMISSION_CONTROL:
            return KafkaShareAvailableNowReader(self.parsed)
        return KafkaShareStreamReader(self.parsed)


class KafkaShareStreamReader(DataSourceStreamReader):
    """Plans micro-batches on the driver; ``read`` runs on executors.

    Spark >= 4.2 hands ``latestOffset`` the batch's start and a read limit; Spark 4.0 and 4.1
    call it without arguments, and the reader tracks the last offset Spark logged itself
    (``seen``): Spark calls ``partitions(offset, offset)`` with it on restart, and
    ``latestOffset`` before ``initialOffset`` on a fresh start.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.seen: dict[str, Any] | None = None  # Spark < 4.2: the last offset Spark logged
        facts = inspect_broker(options.client, options.topics)
        if options.journal_path is not None:
            self._check_lock(facts.lock_ms)
        if options.starting_offsets is not None:
            set_group_configs(options.client,
                              {"share.auto.offset.reset": options.starting_offsets},
                              option="startingOffsets")
        self.lock_ms = facts.lock_ms
        self.delivery_limit = facts.delivery_limit
        self.isolation_level = facts.isolation_level  # for replays of offsets slots
        self.record_locks = facts.record_locks  # what a slot of several fetches may hold
        self.num_partitions = options.num_partitions or max(1, sum(facts.partitions.values()))
        self.available_now_target: dict[TopicPartition, int] | None = None
        self.available_now_first_seq: int | None = None  # first batch this run plans
        self.backlog: Backlog | None = None  # read at the last latestOffset
        self.last_batch: dict[str, int] = {}  # metrics of the last finished batch
        self.warned: set[str] = set()  # the notices logged once per query run (notices.py)
        self.planned = False  # this run planned a data batch (_idle)
        settings = options.journal_settings()
        self.journal = Journal.of(settings) if settings is not None else None
        # Every task must find it before it acknowledges anything: one journal for all.
        self.marker = self.journal.place_marker() if self.journal is not None else None

    def _check_lock(self, lock_ms: int) -> None:
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
        if self.journal is not None:
            used = self.journal.in_use()
            if used is not None:
                raise OptionError(
                    "journalPath", self.options.journal_path,
                    f"this query has no committed batch, but the journal was used before "
                    f"({used}). Give every query its own journal, like its checkpoint; if the "
                    "old query is gone for good, delete the directory",
                )
        return BatchOffset(0, self.num_partitions).json()

    def getDefaultReadLimit(self) -> ReadLimit:  # Spark >= 4.2 only
        if self.options.max_records_per_trigger:
            return ReadMaxRows(self.options.max_records_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: ReadLimit | None = None) -> dict[str, Any]:
        if start is None:  # Spark < 4.2: no start, no read limit (docs/options.md)
            start = self.seen or BatchOffset(0, self.num_partitions).json()
            max_rows = self.options.max_records_per_trigger or 0
        else:
            max_rows = int(limit.max_rows) if isinstance(limit, ReadMaxRows) else 0
        offset = BatchOffset.of(start)
        self._collect_metrics(offset)
        self.backlog = read_backlog(self.options.client, self.options.topics)
        if not self.warned:  # the first trigger of this run
            self.warned.add("started")
            self._notice(available_now_notice(self.options, self.backlog.total))
        if self.backlog.empty:
            return self._idle(start)  # nothing to read
        ends = self._high_watermarks()
        if self.available_now_target is not None:
            if self.available_now_first_seq is None:
                # A restarted query's previous batches say nothing about this run's target.
                self.available_now_first_seq = offset.seq + 1
            elif self._drained(offset, ends):
                return start
        latest = offset.following(
            # Without the planned ends, a skewed share could read far past the backlog.
            self.num_partitions, max_rows, self.backlog.total, ends,
            lags=self.backlog.lags if ends else (),
            polls_per_share=EXACTLY_ONCE_POLLS_PER_SHARE if self.options.exactly_once
            else POLLS_PER_SHARE).json()
        self.planned = True
        if not ADMISSION_CONTROL:
            # Spark < 4.2 has no reportLatestOffset: the metrics ride in the offset itself,
            # shown as endOffset in StreamingQueryProgress (docs/operations.md).
            latest.update(self.reportLatestOffset() or {})
            self.seen = latest
        return latest

    def _idle(self, start: dict[str, Any]) -> dict[str, Any]:
        """The offset while nothing is to read: ``start``, so Spark plans no micro-batch.

        Spark < 4.2 shows the source's metrics only inside the offsets it logs (``endOffset``
        in ``StreamingQueryProgress``), and each data batch's offset carries the lag from
        before it. When the lag or the last batch's metrics changed since (the group drained,
        the last batch finished), this returns ``start`` with them refreshed, under the same
        ``seq``: Spark runs it as one empty micro-batch without tasks (``partitions``), and
        progress shows lag 0 and the last batch's counters. Once, until they change again,
        in a run that planned a data batch. Marked ``REFRESH``: its commit leaves the journal
        alone.
        """
        if ADMISSION_CONTROL or not self.planned:
            # Spark >= 4.2 asks reportLatestOffset on every trigger. A run that planned no
            # data batch leaves the checkpoint's last offset alone: a refresh there would have
            # Spark commit that batch now and the journal forget it, before a redelivered
            # duplicate of it is recognised (test_worker_killed_after_publish_...).
            return start
        report = self.reportLatestOffset() or {}
        if all(start.get(key) == value for key, value in report.items()):
            return start
        refreshed = {**start, **report, REFRESH: True}
        self.seen = refreshed
        return refreshed

    def _notice(self, notice: tuple[str, str] | None) -> None:
        """Log ``(key, text)`` as a WARNING, once per key for this reader (one query run)."""
        if notice is not None and notice[0] not in self.warned:
            self.warned.add(notice[0])
            _LOG.warning("%s", notice[1])

    def _high_watermarks(self) -> dict[TopicPartition, int]:
        """Where each subscribed partition ends now ({}: unknown; the plan then has none)."""
        known = list(self.backlog.by_partition) if self.backlog is not None else []
        try:
            return latest_offsets(self.options.client, self.options.topics, known or None)
        except UnknownTopicError:
            raise
        except Exception:  # noqa: BLE001 - tasks then stop on their backlog share or time
            return {}

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Shown as ``latestOffset`` of this source in ``StreamingQueryProgress``: the group's
        backlog (lag) and the metrics of the last finished batch (see docs/operations.md)."""
        report: dict[str, Any] = {"lastBatch": self.last_batch}
        if self.backlog is not None:
            report["lag"] = self.backlog.total
            report["lagByPartition"] = {tp.key(): lag for tp, lag
                                        in self.backlog.by_partition.items()}
        return report

    def _collect_metrics(self, offset: BatchOffset) -> None:
        """Sum the END-marker stats of batch ``offset`` (the one that just finished)."""
        if offset.seq <= 0 or self.journal is None or \
                self.last_batch.get("batch") == offset.seq:
            return
        totals: dict[str, int] = {"batch": offset.seq}
        for end in self.journal.batch_ends(offset.seq).values():
            totals["records"] = totals.get("records", 0) + end.records
            for key, value in end.stats.items():
                if key == "join_ms":
                    totals["consumer_joins"] = totals.get("consumer_joins", 0) + 1
                    totals["max_join_ms"] = max(totals.get("max_join_ms", 0), value)
                else:
                    totals[key] = totals.get(key, 0) + value
        self.last_batch = totals
        self._notice(oversized_batch_notice(self.options, totals))

    def prepareForTriggerAvailableNow(self) -> None:  # Spark >= 4.2 only
        if self.journal is None:
            raise OptionError(
                "journalPath", None,
                "Trigger.AvailableNow needs journalPath (also with delivery=at-most-once): the "
                "source learns from the journal when the backlog present at start is read",
            )
        self.available_now_target = latest_offsets(self.options.client, self.options.topics)

    def _drained(self, offset: BatchOffset, now: dict[TopicPartition, int]) -> bool:
        """True when batch ``offset`` acquired nothing that was in the topics at AvailableNow
        start (neither emitted nor released), judged from every task's END marker, and the
        group's lag does not show such records still waiting (``now``: high watermarks).

        The lag matters when the batch got nothing because other members hold the records
        (a pooled consumer's fetch, another application in the group): its tasks then saw
        none of them, and stopping would leave them for the next run.
        """
        first = self.available_now_first_seq
        target = self.available_now_target
        if first is None or offset.seq < first or self.journal is None or target is None:
            return False
        if self.backlog is not None and self.backlog.waiting_before(target, now):
            return False
        ends = self.journal.batch_ends(offset.seq)
        if len(ends) < offset.parts:
            return False  # a partition without END was not read to its end: go on
        return all(low >= target.get(tp, 0)
                   for end in ends.values() for tp, low in end.min_offsets.items())

    def _see(self, offset: dict[str, Any]) -> None:
        if self.seen is None or BatchOffset.of(offset).seq >= BatchOffset.of(self.seen).seq:
            self.seen = offset

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self._see(end)
        plan = BatchOffset.of(end)
        if plan.seq == BatchOffset.of(start).seq:
            return []  # Spark < 4.2: an offset that only refreshes the metrics (_idle)
        if self.journal is not None:
            self.journal.planned(plan.seq, plan.parts)
        per_task, backlog_share = plan.task_share()
        # Every subscribed partition as the last backlog read saw them, for the tasks' check
        # that the group is drained.
        known = tuple(self.backlog.by_partition) if self.backlog is not None and \
            self.backlog.by_partition else None
        return [
            KafkaSharePartition(TaskSpec(options=self.options, seq=plan.seq, part=i,
                                         parts=plan.parts, task_max_records=per_task,
                                         backlog_share=backlog_share,
                                         planned_ends=plan.ends or None,
                                         lock_ms=self.lock_ms,
                                         delivery_limit=self.delivery_limit,
                                         partitions=known, journal_marker=self.marker,
                                         poll_records=plan.poll or None,
                                         available_now=self.available_now_target is not None,
                                         isolation_level=self.isolation_level,
                                         trigger_share=plan.exact_share(i),
                                         record_locks=self.record_locks))
            for i in range(plan.parts)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaSharePartition)
        return read_partition(partition.spec)

    def commit(self, end: dict[str, Any]) -> None:
        self._see(end)
        # A refresh offset (_idle) repeats the seq of a batch whose journal the next data
        # batch's commit cleans up, as without it: the journal is left as it was.
        if self.journal is not None and not end.get(REFRESH):
            starts = read_start_offsets(self.options.client)
            plan = BatchOffset.of(end)
            self.journal.commit(plan.seq, self.options.dedup_retention_ms, starts,
                                parts=plan.parts)

    def stop(self) -> None:
        """Spark may never call this; nothing depends on it."""


if TYPE_CHECKING or ADMISSION_CONTROL:

    class KafkaShareAvailableNowReader(KafkaShareStreamReader, SupportsTriggerAvailableNow):
        """Spark >= 4.2: the reader that ``Trigger.AvailableNow`` can drive."""
