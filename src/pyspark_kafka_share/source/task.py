"""Executor side: what one Spark task of one micro-batch does.

``read_partition`` runs in a Python worker on a freshly unpickled reader; everything it needs
arrives in the :class:`TaskSpec` (``spec.py``); it polls through a ``Poller`` (``poller.py``),
which keeps the task within its record and time budget. Exactly-once protocol per poll
(see ``docs/design.md``):

1. poll (explicit acknowledgement mode: the whole poll must be acknowledged before the next);
2. records the journal already holds are duplicates of published records whose
   acknowledgement was lost: ACCEPT them, do not emit them (every record is looked up: after
   a broker crash they come back as first deliveries);
3. if the poll's lock deadline has passed, RELEASE its fresh records (but those on their last
   delivery) and stop; a poll of duplicates only goes on to step 5;
4. publish the fresh records in the next free journal slot (exclusive create); if the batch
   was committed meanwhile (a late attempt), RELEASE (the fence is re-read only by an attempt
   older than half the retention the fence promised and the task's ``journalRetentionMs``
   allow: ``PartLog.fence_holds``);
5. ACCEPT and ``commit_sync``; a failed commit is counted, not fatal: the records are
   journaled, and their redelivery is recognised in step 2.

With ``client=native`` a slot may hold several polls: the task polls again without
acknowledging while ``holding.keep_holding`` says it is safe and worth it (the group's
in-flight limit, the first held poll's lock deadline, a short or empty poll), then runs steps
2-5 once over everything held, under the first held poll's deadline (``_take``, ``_flush``).

It yields its first published slot at once, then once the slots it published and has not
yielded hold twice the rows of its previous yield, up to ``YIELD_ROWS`` rows (or
``YIELD_BYTES``), and after its last poll, it yields the log's data slots published so far, in
slot order; when the task's budget (records, time) is spent it closes the partition log with
END and yields the data slots before END it has not yielded yet (a concurrent attempt's).
Slots it did not publish itself are yielded as the journal holds them
(``journalContent=records``) or read back from Kafka and checked against their checksum
(``offsets``, the default; ``journal/replay.py``). Rows are yielded only after their poll is
acknowledged, so downstream processing time never eats into an acquisition lock; a downstream
that falls further behind than Spark's buffers slows the polling.

A subscribed topic deleted meanwhile fails the task with ``UnknownTopicError`` (polls of it
just come back empty), and a record batch larger than the consumer accepts with a
``BrokerError`` naming ``kafka.receive.message.max.bytes``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from collections.abc import Generator, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from pyspark_kafka_share._kafka import pool as _pool
from pyspark_kafka_share._kafka.arrow import messages_to_batch, partitions_of
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.share import ConsumerSession, split_last_delivery
from pyspark_kafka_share._spark import attempt_identity, query_id
from pyspark_kafka_share.errors import JournalClosed
from pyspark_kafka_share.source.faults import Faults
from pyspark_kafka_share.source.holding import (
    Hold,
    HoldLimits,
    keep_holding,
    poll_keys,
    record_key,
)
from pyspark_kafka_share.source.journal.journal import EndMarker, Journal, PartLog, ScanResult
from pyspark_kafka_share.source.journal.keys import SlotKeys
from pyspark_kafka_share.source.journal.replay import SlotReader
from pyspark_kafka_share.source.journal.slots import OffsetSlot
from pyspark_kafka_share.source.poller import Poller
from pyspark_kafka_share.source.spec import TaskSpec

__all__ = ["TaskSpec", "read_partition"]


def read_partition(spec: TaskSpec) -> Iterator[pa.RecordBatch]:
    """The rows of input partition ``spec.part`` of micro-batch ``spec.seq``."""
    if spec.options.exactly_once:
        yield from _read_exactly_once(spec)
    else:
        yield from _read_at_most_once(spec)


def _settle(session: ConsumerSession, stats: Counter[str], accept: Sequence[Any],
            release: Sequence[Any], partitions: set[TopicPartition] | None = None) -> bool:
    """Acknowledge and commit; True if the broker confirmed every partition."""
    if not accept and not release:
        return True
    settled = session.settle(accept, release, partitions=partitions)
    stats["accepted"] += len(accept)
    stats["released"] += len(release)
    if not settled.ok:
        stats["commit_failures"] += 1
    return settled.ok


def _min_offsets(tables: Sequence[pa.Table | pa.RecordBatch],
                 acquired: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Lowest offset per topic-partition among ``tables`` and ``acquired``."""
    low = dict(acquired)
    for t in tables:
        _lower(low, _summary(t)[1])
    return low


def _summary(t: pa.Table | pa.RecordBatch) -> tuple[int, dict[TopicPartition, int]]:
    """Rows of ``t`` and their lowest offset per topic-partition."""
    return t.num_rows, SlotKeys.of_table(t).lowest()


def _slot_summary(held: pa.Table | OffsetSlot) -> tuple[int, dict[TopicPartition, int]]:
    """Rows of a data slot and their lowest offset per topic-partition, without Kafka."""
    return (held.rows, held.keys().lowest()) if isinstance(held, OffsetSlot) else \
        _summary(held)


def _batches(table: pa.Table | pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    if isinstance(table, pa.RecordBatch):
        yield table
    else:
        yield from table.to_batches()


def _lower(low: dict[TopicPartition, int], more: Mapping[TopicPartition, int]) -> None:
    for tp, off in more.items():
        if tp not in low or off < low[tp]:
            low[tp] = off


POOL_AFTER_TASKS_UNDER_S = 2.0
"""A consumer goes back to the pool only after a task shorter than this; else it is closed.

An idle pooled consumer stays a member of the group and keeps the partitions the assignor gave
it, and Spark may run the next batch's tasks in other Python workers (it takes the worker
idle longest): their new consumers then miss those partitions until a heartbeat after the idle
one leaves (5 s by default). Pooling saves a join (about 1 s), which matters for short batches
only; under ``Trigger.AvailableNow`` (``TaskSpec.available_now``) nothing is pooled. Measured
on the throughput benchmark's setup (8 Python workers, 4 tasks, a 2 M-record AvailableNow
drain): pooled, 60-74 s in 7-8 batches; closed at each task's end, 24-26 s in 3
(docs/design.md, "Idle consumers keep their partitions").
"""


def _keep_consumer(spec: TaskSpec, poller: Poller) -> bool:
    """Whether the task's consumer goes back to the pool (counted as ``consumers_pooled``)."""
    keep = not spec.available_now and \
        time.monotonic() - poller.start < POOL_AFTER_TASKS_UNDER_S
    if keep:
        poller.stats["consumers_pooled"] = 1
    return keep


def _release_consumer(spec: TaskSpec, pc: _pool.PooledConsumer, *, healthy: bool,
                      keep: bool) -> None:
    if healthy and not keep:
        _pool.discard(pc)
        return
    if pc.session.fetch_pending:
        pc.idle_timeout_s = spec.pending_idle_timeout_s
    _pool.release(pc, healthy=healthy)


def _acquire_consumer(spec: TaskSpec) -> _pool.PooledConsumer:
    return _pool.acquire(spec.consumer_recipe(), spec.options.topics, spec.idle_timeout_s,
                         spec.options.client.timeout_s)


# -- exactly-once ---------------------------------------------------------------------------


def _read_exactly_once(spec: TaskSpec) -> Iterator[pa.RecordBatch]:
    opts = spec.options
    assert opts.journal_path is not None
    _, attempt_id, attempt_number = attempt_identity()
    faults = Faults(opts.fault_injection, seq=spec.seq, part=spec.part,
                    attempt_number=attempt_number)
    journal = spec.journal()
    owner = query_id()
    if owner:
        journal.claim(owner)
    log = journal.part_log(spec.seq, spec.part)
    try:
        scan = log.open()
    except JournalClosed:
        return  # a late attempt of a batch Spark already committed: its output is unused
    emitted = 0
    if scan.end is None:
        fill = _Fill(spec, journal, log, scan, attempt_id=attempt_id, faults=faults)
        scan = yield from fill.run(_acquire_consumer(spec))
        emitted = fill.emitted
    faults.hit("kill-after-end")
    rest = scan.data_slots[emitted:]
    if rest:
        # Slots this attempt did not poll (a retry, a speculative copy, a restart, or a
        # concurrent attempt's after our END): as written, or read back from Kafka once.
        reader = SlotReader(log, spec.replay_settings(), Counter())
        for _, table in reader.read(rest):
            yield from _batches(table)
        reader.write_losses(attempt_id)


YIELD_ROWS = 10_000
"""An exactly-once task hands the slots it published to Spark once they hold this many rows
(or ``YIELD_BYTES`` of Arrow buffers), and the rest at its end, instead of after every poll.

Each yield waits until Spark's Python worker has passed the rows on, so yielding after every
poll (about 2,000 records) stalled every poll: with ``journalFsync=false`` it was most of the
journal's overhead in the throughput benchmark (+43% against +14% when yielding at the end;
docs/benchmarks/journal-content/README.md). A micro-batch's rows reach the sink only when all
its tasks end, so a mid-task yield only pipelines the transfer to the JVM with the polling:
10,000 rows is one Arrow batch of Spark's default
``spark.sql.execution.arrow.maxRecordsPerBatch``, and bounds what a task holds (at-most-once
holds all of it until its end).

The first slot goes at once and the threshold doubles from there up to ``YIELD_ROWS``, so that
work downstream of the source (a mapInArrow, with Spark's Arrow batches made smaller) starts on
a task's first records instead of after its whole share: a few more yields per task, each
after an acknowledged slot (docs/benchmarks/README.md, the source's spread).
"""
YIELD_BYTES = 32 << 20


class _Split(NamedTuple):
    """One poll split by the journal; ``batch`` and ``keys`` are ``fresh``'s."""

    fresh: Sequence[Any]
    dups: Sequence[Any]
    batch: pa.RecordBatch
    keys: SlotKeys


class _Fill:
    """One attempt's poll -> journal -> acknowledge loop for one partition log, then END.

    Yields the log's data slots in slot order once they are published and acknowledged and
    this attempt's hold ``yield_at`` rows (the first slot at once, then twice the previous
    yield's rows up to ``YIELD_ROWS``) or ``YIELD_BYTES`` (its own from memory, an
    earlier or concurrent attempt's through the journal), so Spark takes rows while the task
    polls, and the rest after the last poll, before END. ``emitted``: the slots yielded so far
    (``0 .. emitted - 1``); the run's return value is the final scan.
    """

    def __init__(self, spec: TaskSpec, journal: Journal, log: PartLog, scan: ScanResult, *,
                 attempt_id: int, faults: Faults) -> None:
        self.spec = spec
        self.journal = journal
        self.log = log
        self.attempt_id = attempt_id
        self.faults = faults
        self.stats: Counter[str] = Counter()
        self.own: dict[int, pa.RecordBatch] = {}  # published, not yet yielded
        self.held_rows = self.held_bytes = 0  # in ``own``
        self.yield_at = 1  # rows in ``own`` that are yielded: doubles up to YIELD_ROWS
        self.emitted = 0
        self.summaries: dict[int, tuple[int, dict[TopicPartition, int]]] = {}  # rows, lowest
        self.acked_slots: list[int] = []
        self.reader = SlotReader(log, spec.replay_settings(), self.stats)
        existing = sum(_slot_summary(log.slot(s))[0] for s in scan.data_slots)
        self.budget = None if spec.record_budget is None else spec.record_budget - existing
        self.pending: Sequence[Any] = []  # being journaled, not yet acknowledged
        # Polls held for the next slot (holding.py: several with the native client).
        self.hold = Hold()
        sharers = -(-spec.parts // len(spec.partitions)) if spec.partitions else 1
        self.limits = HoldLimits.of(spec.options.share_client == "native", spec.record_locks,
                                    spec.lock_budget_s, sharers, budget=self.budget)
        self.round_mark, self.slowest_round_s = time.monotonic(), 0.0

    def run(self, pc: _pool.PooledConsumer) -> Generator[pa.RecordBatch, None, ScanResult]:
        """Poll until the budget is spent or a step says stop, yielding what is published;
        END the log; return the final scan."""
        self.session = pc.session
        poller = self.poller = Poller(self.spec, pc, self.budget, self.stats,
                                      poll_cap=self.limits.cap or None)
        healthy = keep = True
        try:
            while True:
                polled = poller.next_poll(holding=bool(self.hold.polls))
                if polled is None:
                    # The budget (records, time) is spent: journal what is held. Held
                    # duplicates counted in the record budget come back with it; the poller
                    # then says whether any is left.
                    if not self.hold.polls or not self._flush():
                        break
                    poller.resume()
                    continue
                go_on = self._take(*polled)
                if not self.hold.polls and self.own and \
                        (self.held_rows >= self.yield_at or self.held_bytes >= YIELD_BYTES):
                    # Everything polled is acknowledged: waiting here holds no lock.
                    self.yield_at = min(YIELD_ROWS, 2 * max(self.yield_at, self.held_rows))
                    yield from self._emit(max(self.own))
                # Journaling, acknowledging and Spark taking the rows is no time without
                # records; a poll of duplicates only emits nothing, and its lookup and ACCEPT
                # under load took pollTimeoutMs (the task ended with its share unread).
                poller.resume()
                if not go_on:
                    break
            if self.own:
                yield from self._emit(max(self.own))
            self.faults.hit("fail-before-end")
            self.faults.hit("sleep-before-end")
            keep = _keep_consumer(self.spec, poller)
            return self._end()
        except GeneratorExit:
            # Spark stopped pulling rows (a limit; take() or show() in foreachBatch). END the
            # log as a finished task would: the batch's content is fixed (a later action on it
            # replays those slots), and the driver sees the partition ended.
            healthy = False
            with contextlib.suppress(Exception):
                self._end()
            raise
        except BaseException:
            healthy = False
            if self.pending or self.hold.polls:
                # The original error matters more; unreleased records come back when their
                # lock expires.
                with contextlib.suppress(Exception):
                    self.session.settle(release=self.pending or self.hold.joined())
            raise
        finally:
            _release_consumer(self.spec, pc, healthy=healthy, keep=keep)

    def _take(self, msgs: Sequence[Any], deadline: float) -> bool:
        """Hold a poll for the next slot, or journal and acknowledge what is held (an empty
        ``msgs``: the poll while holding came back empty); False when the task must stop."""
        now = time.monotonic()
        if self.hold.polls:
            self.slowest_round_s = max(self.slowest_round_s, now - self.round_mark)
        self.round_mark = now
        lost = self.session.acquisitions_lost()
        if self.hold.polls and self.hold.lost != lost and not self._give_back_held(msgs):
            if msgs:  # stopping: this poll is given back as the held ones were
                self._step(msgs, -math.inf, late_stops=False)
            return False
        if msgs:
            self.hold.add(msgs, deadline, lost)
            if self.poller.budget is not None:
                self.poller.budget -= len(msgs)  # what is held; _step gives back duplicates
            if keep_holding(self.limits, held=self.hold.records, largest_poll=self.hold.largest,
                            last_poll=len(msgs), first_deadline=self.hold.first_deadline,
                            now=now, slowest_round_s=self.slowest_round_s,
                            budget_left=self.poller.budget):
                return True
        return self._flush()

    def _give_back_held(self, current: Sequence[Any]) -> bool:
        """The consumer lost acquisitions while polls were held (a session, a leader, the
        membership): every held record not in ``current`` (the poll just taken, acquired
        after the loss) is given back as past its deadline; False when the task must stop."""
        again = poll_keys(current)
        held = [m for p in self.hold.polls for m in p if record_key(m) not in again]
        if self.poller.budget is not None:  # those in ``current`` are counted again
            self.poller.budget += self.hold.records - len(held)
        polls = len(self.hold.polls)
        self.hold.clear()
        self.stats["holds_lost"] += 1
        return self._step(held, -math.inf, polls, late_stops=False)

    def _flush(self) -> bool:
        """Journal and acknowledge everything held, in one slot; False when the task must
        stop. The first held poll's lock deadline governs all of it; a tainted hold
        (``Hold.tainted``) is given back as past it."""
        msgs, polls, deadline = self.hold.joined(), len(self.hold.polls), self.hold.first_deadline
        if self.hold.tainted(self.session.acquisitions_lost(), msgs):
            self.stats["holds_lost"] += 1
            deadline = -math.inf
        self.hold.clear()
        return self._step(msgs, deadline, polls, late_stops=deadline > -math.inf)

    def _step(self, msgs: Sequence[Any], deadline: float, polls: int = 1, *,
              late_stops: bool = True) -> bool:
        """Journal and acknowledge the records of ``polls`` polls; False when the task must
        stop (past ``deadline`` with nothing to journal, if ``late_stops``)."""
        self.pending = msgs
        fresh, dups, batch, keys = self._split_duplicates(msgs)
        self.faults.hit("fail-before-publish")
        self.faults.hit("sleep-before-publish")
        if fresh and time.monotonic() > deadline:
            # Past the deadline the lock may expire before the slot is visible, and the record
            # could be journaled twice. A record at the delivery limit is the exception: the
            # broker archives it instead of redelivering it, so RELEASE would lose it and
            # publishing cannot duplicate it. A poll of duplicates only has nothing to
            # journal: it is ACCEPTed below and the task polls on (stopping here left a killed
            # attempt's retry without its share, test_worker_killed_after_publish_...).
            last, late = split_last_delivery(fresh, self.spec.delivery_limit)
            self._give_back(dups, late, "released_lock_deadline")
            if not last:
                if self.poller.budget is not None:
                    self.poller.budget += len(msgs)
                return not late_stops
            if len(last) != len(fresh):
                batch, keys = self._arrow(last)
            fresh, dups, self.pending = last, [], last
        slot = None
        if fresh:
            slot = self._publish(fresh, dups, batch, keys, polls)
            if slot is None:
                return False
        known: set[TopicPartition] | None = \
            set(keys.by_partition) if slot is not None and not dups else None
        confirmed = _settle(self.session, self.stats, self.pending, [], known)
        self.pending = []
        if slot is not None and confirmed:
            self.acked_slots.append(slot)
        if self.poller.budget is not None:  # the budget counts fresh records only
            self.poller.budget += len(msgs) - len(fresh)
        return True

    def _split_duplicates(self, msgs: Sequence[Any]) -> _Split:
        """The records the journal does not hold yet, and those it does.

        Every record is looked up, first deliveries too: the broker keeps an acquisition's
        delivery count in memory only, so after a broker restart a record that was journaled
        but whose ACCEPT was lost comes back with delivery count 1. The poll is converted to
        Arrow first: its keys come from the columns, and the common case (nothing journaled)
        publishes that same batch.
        """
        batch, keys = self._arrow(msgs)
        self.stats["redelivered"] += int(
            np.count_nonzero(np.asarray(batch.column("deliveryCount")) > 1))
        dups = self.journal.find_journaled(keys)
        if not dups:
            return _Split(msgs, [], batch, keys)  # the common case
        fresh = [m for m in msgs if record_key(m) not in dups]
        dup_msgs = [m for m in msgs if record_key(m) in dups]
        self.poller.note_unemitted(dup_msgs)
        self.stats["duplicates_dropped"] += len(dup_msgs)
        return _Split(fresh, dup_msgs, *self._arrow(fresh))

    def _arrow(self, msgs: Sequence[Any]) -> tuple[pa.RecordBatch, SlotKeys]:
        """``msgs`` as one Arrow batch, and its keys."""
        batch = messages_to_batch(msgs, self.spec.options.include_headers)
        return batch, SlotKeys.of_table(batch)

    def _publish(self, fresh: Sequence[Any], dups: Sequence[Any], batch: pa.RecordBatch,
                 keys: SlotKeys, polls: int) -> int | None:
        """Journal ``fresh`` (as ``batch``, whose keys are ``keys``) in the next free slot: its
        number, or None (records given back) when the log was closed or the batch committed by
        the time the slot was visible."""
        try:
            slot = self.log.append(batch, self.attempt_id, keys)
        except JournalClosed:
            self._give_back(dups, fresh, "released_closed")
            return None
        if not self.log.fence_holds() and self.journal.committed_seq() >= self.spec.seq:
            # A late attempt: Spark committed this batch while we polled. The slot may not be
            # in its output: give the records back (the slot stays; no slot is ever deleted
            # alone, see PartLog.fence_holds, which spares a young attempt this read).
            self._give_back(dups, fresh, "released_closed")
            return None
        self.own[slot] = batch
        self.held_rows += batch.num_rows
        self.held_bytes += batch.get_total_buffer_size()
        self.summaries[slot] = (batch.num_rows, keys.lowest())
        self.stats["journal_bytes"] += self.log.last_slot_bytes
        self.stats["journal_slots"] += 1
        self.stats["slot_polls"] += polls
        self.faults.hit("kill-after-publish")
        self.faults.hit("sleep-after-publish")
        return slot

    def _end(self) -> ScanResult:
        """END the log; the final scan, which starts with every slot yielded so far."""
        scan = self.log.end(self._marker)
        if len(scan.data_slots) < self.emitted:
            # The batch was committed and its slots deleted while this (late) attempt read
            # it, and END landed in the emptied log (an object store has no directory to
            # vanish). What it yielded is not the log's content: fail, do not return it.
            raise JournalClosed(f"batch {self.spec.seq} was committed while this attempt "
                                "read it")
        return scan

    def _emit(self, upto: int) -> Iterator[pa.RecordBatch]:
        """Yield the data slots ``emitted .. upto``: all exist (a slot is created only after
        the one before it), so the order is the log's, as a re-run of the batch yields it."""
        self.held_rows = self.held_bytes = 0
        others = [s for s in range(self.emitted, upto + 1) if s not in self.own]
        replayed = dict(self.reader.read(others)) if others else {}
        for slot in range(self.emitted, upto + 1):
            table = self.own.pop(slot) if slot in self.own else replayed.pop(slot)
            if slot not in self.summaries:
                self.summaries[slot] = _summary(table)
            self.emitted = slot + 1
            yield from _batches(table)

    def _give_back(self, accept: Sequence[Any], release: Sequence[Any], counter: str) -> None:
        """ACCEPT ``accept`` (journaled already), RELEASE ``release`` (not emitted)."""
        self.stats[counter] += len(release)
        self.poller.note_unemitted(release)
        _settle(self.session, self.stats, accept, release)
        self.pending = []

    def _marker(self, scan: ScanResult) -> EndMarker:
        low, records = dict(self.poller.acquired_low), 0
        for i in scan.data_slots:
            rows, mins = self.summaries.get(i) or _slot_summary(self.log.slot(i))
            records += rows
            _lower(low, mins)
        return EndMarker(
            attempt=self.attempt_id, data_slots=len(scan.data_slots), records=records,
            acked_slots=tuple(i for i in self.acked_slots if i in scan.data_slots),
            stats=dict(self.stats), min_offsets=low,
        )


# -- at-most-once ---------------------------------------------------------------------------


def _read_at_most_once(spec: TaskSpec) -> Iterator[pa.RecordBatch]:
    """ACCEPT on poll, then yield: a failure after the ACCEPT loses those records."""
    opts = spec.options
    stats: Counter[str] = Counter()
    _, attempt_id, _ = attempt_identity()
    log = spec.journal().part_log(spec.seq, spec.part) \
        if opts.journal_path else None
    if log is not None:
        try:
            if log.open().end is not None:
                return  # a re-run batch: at-most-once keeps no records to replay
        except JournalClosed:
            return
    pc = _acquire_consumer(spec)
    poller = Poller(spec, pc, spec.record_budget, stats)
    healthy = keep = True
    emitted: list[pa.RecordBatch] = []
    try:
        while (polled := poller.next_poll()) is not None:
            msgs, _deadline = polled
            batch = messages_to_batch(msgs, opts.include_headers)
            _settle(pc.session, stats, msgs, [], partitions_of(batch))
            emitted.append(batch)
            if poller.budget is not None:
                poller.budget -= len(msgs)
        keep = _keep_consumer(spec, poller)
    except BaseException:
        healthy = keep = False
        raise
    finally:
        _release_consumer(spec, pc, healthy=healthy, keep=keep)
    if log is not None:
        log.end(lambda s: EndMarker(attempt=attempt_id, data_slots=0,
                                    records=sum(b.num_rows for b in emitted),
                                    stats=dict(stats),
                                    min_offsets=_min_offsets(emitted, poller.acquired_low)))
    yield from emitted
