"""Polling within a task's budget: records, time, and the signs that its batch has nothing
more for it (a drained group, records produced after the plan, brokers down).

Both delivery modes poll through :class:`Poller`; what they do with a poll is in ``task.py``.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pyspark_kafka_share._kafka import pool as _pool
from pyspark_kafka_share._kafka.arrow import ColumnarPoll
from pyspark_kafka_share._kafka.group import (
    UNKNOWN_BACKLOG,
    TopicWatch,
    latest_offsets,
    read_backlog,
)
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.share import BrokerWatch
from pyspark_kafka_share.source.spec import TaskSpec

__all__ = ["DrainProbe", "Poller"]


class DrainProbe:
    """Ends a task early, instead of after ``pollTimeoutMs`` without records, once no poll can
    return a record of its batch: the group's backlog is empty, or no partition has more
    records waiting than were produced after the batch was planned (its planned ends). Under a
    steady stream the second is what ends a task whose share other tasks took.

    Lag over-counts records other tasks still hold (they may be released), so those keep
    this task waiting. Ending early loses nothing: a record left is read by a later batch. A
    failed read turns the probe off for the task, which then ends by the timeout.
    """

    _QUIET_S = 0.25  # no record for this long before asking
    _EVERY_S = 0.25

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        self.enabled = spec.partitions is not None
        self.last_check = 0.0

    def drained(self, last_record: float) -> bool:
        now = time.monotonic()
        if not self.enabled or now - last_record < self._QUIET_S or \
                now - self.last_check < self._EVERY_S:
            return False
        self.last_check = now
        opts = self.spec.options
        backlog = read_backlog(opts.client, opts.topics, self.spec.partitions)
        if backlog is UNKNOWN_BACKLOG:
            self.enabled = False
        if backlog.empty:
            return True
        ends = self.spec.planned_ends
        if not ends or backlog.total is None:
            return False
        try:
            return backlog.within(ends, latest_offsets(opts.client, opts.topics, list(ends)))
        except Exception:  # noqa: BLE001 - a topic gone or brokers down: the polls tell
            return False


class Poller:
    """Polls a pooled consumer within the task's record and time budget."""

    def __init__(self, spec: TaskSpec, pc: _pool.PooledConsumer, budget: int | None,
                 stats: Counter[str], *, poll_cap: int | None = None) -> None:
        """``poll_cap``: records a poll asks for at most (the native client's share of the
        in-flight limit, ``holding.HoldLimits``), besides the budget."""
        opts = spec.options
        self.spec = spec
        self.pc = pc
        self.budget = budget
        self.stats = stats
        self.start = time.monotonic()
        # A consumer that just joined gets its assignment only after a heartbeat round or two.
        join = opts.join_timeout_ms / 1000 if pc.uses == 1 else 0.0
        self.last_record = self.start + join
        # The drain probe does not wait for the join: a group with nothing left for this
        # batch ends a joining consumer's task as well (it would wait joinTimeoutMs).
        self.last_seen = self.start
        self.poll_timeout_s = opts.poll_timeout_ms / 1000
        self.max_batch_s = opts.batch_duration_ms(spec.available_now) / 1000
        self.time_cap_s = max(self.max_batch_s, join + self.poll_timeout_s)
        self.deadline_s = spec.lock_budget_s
        # Lowest offset per topic-partition of records acquired but not emitted (emitted
        # ones are in the END marker's tables), for AvailableNow.
        self.acquired_low: dict[TopicPartition, int] = {}
        self.probe = DrainProbe(spec)
        self.watch = TopicWatch(opts.client, opts.topics) \
            if spec.partitions is not None else None
        self.brokers = BrokerWatch(opts.client, opts.topics, opts.broker_timeout_ms / 1000)
        self.past_plan = False  # polled a record produced after the batch was planned
        self.poll_cap = poll_cap

    def resume(self) -> None:
        """The last poll is journaled and acknowledged and Spark took its rows: waiting for
        records starts again now (time spent on a poll and downstream is not time without
        records)."""
        now = time.monotonic()
        self.last_record = max(self.last_record, now)
        self.last_seen = max(self.last_seen, now)

    def note_unemitted(self, msgs: Sequence[Any]) -> None:
        """Remember the offsets of acquired records that this task does not emit."""
        for m in msgs:
            tp = TopicPartition(m.topic(), m.partition())
            low = self.acquired_low.get(tp)
            if low is None or m.offset() < low:
                self.acquired_low[tp] = m.offset()

    def _spent(self, now: float) -> bool:
        if self.budget is not None and self.budget <= 0:
            return True
        if self.past_plan:
            return True
        if self.brokers.down:  # its empty polls are no "no data": ride it out, or fail
            return False
        elapsed = now - self.start
        # maxBatchDurationMs bounds a task once records flow; a consumer still joining may
        # wait up to joinTimeoutMs + pollTimeoutMs for its first records.
        return elapsed >= self.time_cap_s or now - self.last_record >= self.poll_timeout_s \
            or (elapsed >= self.max_batch_s and self.stats["records_acquired"] > 0)

    def _note_plan_end(self, msgs: Sequence[Any]) -> None:
        ends = self.spec.planned_ends
        if not ends or self.past_plan:
            return
        if isinstance(msgs, ColumnarPoll):  # from its columns: no message objects
            past = any(int(offsets.max()) >= ends[tp]
                       for tp, offsets in msgs.offsets_by_partition().items()
                       if tp in ends and len(offsets))
        else:
            past = any(m.offset() >= ends.get(TopicPartition(m.topic(), m.partition()),
                                              m.offset() + 1) for m in msgs)
        if past:
            self.past_plan = True
            self.stats["ended_past_plan"] = 1

    def next_poll(self, holding: bool = False) -> tuple[Sequence[Any], float] | None:
        """The next non-empty poll and its lock deadline, or None when the budget is spent.
        ``holding``: the caller holds records of earlier polls unacknowledged (a slot of
        several fetches), so an empty poll comes back too (its deadline: infinity), for the
        caller to journal them: the drain probe and the timeouts wait for that (held records
        count in the group's lag)."""
        session = self.pc.session
        while not self._spent(time.monotonic()):
            # The budget caps the poll, strictly with the native client near it, so that a
            # task reads exactly its share; the in-flight share (poll_cap) caps it too, but
            # need not be exact: it never makes a poll strict.
            msgs, acquired = session.poll(min(0.2, self.poll_timeout_s), self.budget,
                                          soft_cap=self.poll_cap)
            self.brokers.observe(session.take_errors(), bool(msgs))
            self.stats["polls"] += 1
            if not msgs and holding:
                return msgs, math.inf
            if not msgs:
                if self.brokers.down:
                    self.stats["polls_brokers_down"] += 1
                    continue
                if self.probe.drained(self.last_seen):
                    self.stats["ended_drained"] = 1
                    return None
                if self.watch is not None:
                    self.watch.check(time.monotonic() - self.last_record)
                continue
            if self.stats["records_acquired"] == 0 and self.pc.uses == 1:
                self.stats["join_ms"] = int((session.last_poll - session.created) * 1000)
            self.stats["records_acquired"] += len(msgs)
            self.last_record = self.last_seen = session.last_poll
            self._note_plan_end(msgs)
            return msgs, acquired + self.deadline_s
        return None
