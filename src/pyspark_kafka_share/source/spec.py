"""What one task of one micro-batch needs, pickled from the driver into its ``InputPartition``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark_kafka_share._kafka.consumers import ConsumerRecipe
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.share import lock_budget_s
from pyspark_kafka_share.source.journal import Journal
from pyspark_kafka_share.source.journal.replay import ReplaySettings
from pyspark_kafka_share.source.options import SourceOptions

__all__ = ["TaskSpec"]


@dataclass(frozen=True)
class TaskSpec:
    """What one task needs, pickled from the driver into the ``InputPartition``."""

    options: SourceOptions
    seq: int
    part: int
    parts: int
    task_max_records: int | None  # maxRecordsPerTrigger's share: also caps max.poll.records
    lock_ms: int
    delivery_limit: int = 5
    # The task's share of the lag when the batch was planned (None: unknown): a batch reads
    # about what was there, as Spark's kafka source reads up to the offsets it planned.
    backlog_share: int | None = None
    # High watermark of each partition when the batch was planned (None: unknown): a
    # poll with a record at or past it reaches records produced since, and ends the task.
    planned_ends: Mapping[TopicPartition, int] | None = None
    # Every partition subscribed at planning, for the drained-group and deleted-topic
    # checks (None: skip both).
    partitions: tuple[TopicPartition, ...] | None = None
    # The marker the driver left in the journal (Journal.place_marker); None: not checked.
    journal_marker: str | None = None
    # Records per poll the plan chose from the backlog share (offset.poll_size; None: the
    # consumer's own max.poll.records).
    poll_records: int | None = None
    # Trigger.AvailableNow: batches follow back to back, so the consumer is closed at the end
    # of the task, never pooled (POOL_AFTER_TASKS_UNDER_S).
    available_now: bool = False
    # The share group's share.isolation.level, read at planning: what a replay of an
    # ``offsets`` journal slot reads Kafka with (the records the group could hand out).
    isolation_level: str = "read_uncommitted"
    # This task's exact share of maxRecordsPerTrigger (the shares sum to it; None: none, or
    # task_max_records, which is rounded up so that every task's consumer is alike).
    trigger_share: int | None = None
    # The group's share.partition.max.record.locks, read at planning (None: the broker has no
    # such group config): what a slot of several fetches holds at most (holding.py).
    record_locks: int | None = None

    def journal(self) -> Journal:
        """The journal, checked to be the driver's (see ``Journal.check_marker``)."""
        settings = self.options.journal_settings()
        assert settings is not None, "a task opens the journal only when journalPath is set"
        journal = Journal.of(settings)
        if self.journal_marker is not None:
            journal.check_marker(self.journal_marker)
        return journal

    def replay_settings(self) -> ReplaySettings:
        """How slots this task did not poll are read back from Kafka."""
        return ReplaySettings(self.options.client, isolation_level=self.isolation_level,
                              include_headers=self.options.include_headers,
                              fail_on_data_loss=self.options.fail_on_data_loss)

    def consumer_recipe(self) -> ConsumerRecipe:
        """The task's share consumer: the ``client`` option's, polling at most the task's
        share of ``maxRecordsPerTrigger`` and the plan's poll size; the native client in the
        strict ``record_limit`` mode under such a cap (so that ``maxRecordsPerTrigger`` is
        exact), else taking whole producer batches (``SourceOptions.consumer_recipe``)."""
        caps = [n for n in (self.task_max_records, self.poll_records) if n]
        return self.options.consumer_recipe(max_poll_records=min(caps) if caps else None)

    @property
    def record_budget(self) -> int | None:
        """Records the task reads at most (None: bounded by time only). Overshoot with
        librdkafka: the rest of the poll that reaches it (whole producer batches); none with
        the native client under a cap, whose strict polls ask for what is left of it (without
        one, whole producer batches until the budget is within two polls, then strict)."""
        cap = self.trigger_share if self.trigger_share is not None else self.task_max_records
        shares = [n for n in (cap, self.backlog_share) if n is not None]
        return min(shares) if shares else None

    @property
    def lock_budget_s(self) -> float:
        return lock_budget_s(self.lock_ms, self.options.lock_safety_fraction)

    @property
    def idle_timeout_s(self) -> float:
        """Pooled consumers are closed sooner than their records' lock deadline could pass."""
        return min(self.options.consumer_idle_timeout_ms / 1000, self.lock_budget_s / 2)

    @property
    def pending_idle_timeout_s(self) -> float:
        """Idle limit for a consumer whose last poll was empty: librdkafka's fetch is still
        running and may acquire records nobody polls, so it is closed (releasing them) soon."""
        return min(self.idle_timeout_s, 2.0, self.lock_budget_s / 4)
