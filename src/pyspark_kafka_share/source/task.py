"""Executor side: what one Spark task of one micro-batch does.

``read_partition`` runs in a Python worker on a freshly unpickled reader; everything it needs
arrives in the :class:`TaskSpec`. Exactly-once protocol per poll (see ``docs/design.md``):

1. poll (explicit acknowledgement mode: the whole poll must be acknowledged before the next);
2. records redelivered (``deliveryCount > 1``) that the journal already holds are duplicates
   of published records whose acknowledgement was lost: ACCEPT them, do not emit them;
3. if the poll's lock deadline has passed, RELEASE everything and stop;
4. publish the fresh records in the next free journal slot (exclusive create);
5. ACCEPT and ``commit_sync``; a failed commit is counted, not fatal: the records are
   journaled, and their redelivery is recognised in step 2.

When the task's budget (records, time) is spent it closes the partition log with END and
yields the data slots before END. Rows are yielded only after everything is acknowledged, so
downstream processing time never eats into an acquisition lock.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pyspark_kafka_share._kafka import pool as _pool
from pyspark_kafka_share._kafka.arrow import messages_to_batch
from pyspark_kafka_share.errors import BrokerError, JournalClosed
from pyspark_kafka_share.source.journal.journal import (
    EndMarker,
    Journal,
    PartLog,
    ScanResult,
)
from pyspark_kafka_share.source.options import SourceOptions

__all__ = ["ACQUIRE_MARGIN_S", "TaskSpec", "raise_client_errors", "read_partition",
           "task_context"]

# A response's records were acquired at most this long before librdkafka queued them.
ACQUIRE_MARGIN_S = 0.5

# librdkafka errors (reported through error_cb only) after which polls would just come back
# empty: the task fails instead of reading "no data". _TRANSPORT alone is retried inside.
_FAILING_ERRORS = frozenset({
    "_ALL_BROKERS_DOWN", "_AUTHENTICATION", "_SSL", "_RESOLVE", "_FATAL",
    "TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED", "SASL_AUTHENTICATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED", "UNKNOWN_TOPIC_OR_PART", "UNKNOWN_TOPIC_ID",
})


def raise_client_errors(errors: list[Any]) -> None:
    """Raise :class:`BrokerError` if librdkafka reported an error polls would hide."""
    bad = [e for e in errors if e.fatal() or e.name() in _FAILING_ERRORS]
    if bad:
        raise BrokerError(f"the share consumer reported {bad[0].name()}: {bad[0].str()}"
                          f"{f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''}")


@dataclass(frozen=True)
class TaskSpec:
    """What one task needs, pickled from the driver into the ``InputPartition``."""

    options: SourceOptions
    seq: int
    part: int
    parts: int
    max_records: int | None
    lock_ms: int
    delivery_limit: int = 5
    # Partitions of the subscribed topics at planning, for the drained-group check (None: skip).
    topic_partitions: int | None = None

    def consumer_config(self) -> dict[str, str]:
        conf = self.options.consumer_config()
        if self.max_records is not None:
            # Sent as ShareFetch MaxRecords; the broker still acquires whole producer batches.
            conf["max.poll.records"] = str(min(self.max_records,
                                               int(conf["max.poll.records"])))
        return conf

    @property
    def idle_timeout_s(self) -> float:
        """Pooled consumers are closed sooner than their records' lock deadline could pass."""
        opts = self.options
        return min(opts.consumer_idle_timeout_ms, self.lock_ms * opts.lock_safety_fraction / 2) \
            / 1000

    @property
    def pending_idle_timeout_s(self) -> float:
        """Idle limit for a consumer whose last poll was empty: librdkafka's fetch is still
        running and may acquire records nobody polls, so it is closed (releasing them) soon."""
        lock_budget_s = self.lock_ms * self.options.lock_safety_fraction / 1000
        return min(self.idle_timeout_s, 2.0, lock_budget_s / 4)


def task_context() -> Any:
    """Spark's ``TaskContext`` of the running task, or None outside a Spark task."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover
        return None
    return TaskContext.get()


def _query_id() -> str | None:
    """Spark's id of the running streaming query (stable across restarts), if any."""
    ctx = task_context()
    return None if ctx is None else ctx.getLocalProperty("sql.streaming.queryId")


def _attempt_identity() -> tuple[int, int]:
    """(taskAttemptId, attemptNumber) from Spark, or a random id outside Spark."""
    ctx = task_context()
    if ctx is None:
        return uuid.uuid4().int & 0x7FFF_FFFF_FFFF, 0
    return int(ctx.taskAttemptId()), int(ctx.attemptNumber())


class _Faults:
    """Test-only failure injection (option ``_faultInjection``); see tests/integration."""

    def __init__(self, spec: TaskSpec, attempt_number: int) -> None:
        self.points: dict[str, dict[str, str]] = {}
        raw = spec.options.fault_injection
        if not raw:
            return
        for item in raw.split(";"):
            name, *conds = item.strip().split(":")
            kv = dict(c.split("=", 1) for c in conds if "=" in c)
            if kv.get("seq", str(spec.seq)) != str(spec.seq):
                continue
            if kv.get("part", str(spec.part)) != str(spec.part):
                continue
            if kv.get("attempt", str(attempt_number)) != str(attempt_number):
                continue
            self.points[name] = kv

    def hit(self, name: str) -> None:
        kv = self.points.get(name)
        if kv is None:
            return
        if name.startswith("kill"):
            os._exit(137)  # the Python worker dies: no finally, no acknowledgement
        if name.startswith("sleep"):
            time.sleep(int(kv.get("ms", "1000")) / 1000)
            return
        raise RuntimeError(f"injected failure: {name}")


def _key(m: Any) -> tuple[str, int, int]:
    return (m.topic(), m.partition(), m.offset())


class _Acker:
    """Acknowledges whole polls and counts outcomes."""

    def __init__(self, consumer: Any, stats: Counter[str], timeout_s: float) -> None:
        self.consumer = consumer
        self.stats = stats
        self.timeout_s = timeout_s

    def settle(self, accept: list[Any], release: list[Any],
               partitions: set[tuple[str, int]] | None = None) -> bool:
        """ACCEPT ``accept`` and RELEASE ``release``, commit; True if the broker confirmed.

        ``partitions``: the (topic, partition)s of ``accept`` + ``release`` when the caller
        knows them already (from an Arrow batch); worked out per message otherwise.
        """
        from confluent_kafka import AcknowledgeType

        ack = self.consumer.acknowledge
        for m in accept:
            ack(m, AcknowledgeType.ACCEPT)
        for m in release:
            ack(m, AcknowledgeType.RELEASE)
        if not accept and not release:
            return True
        results = self.consumer.commit_sync(self.timeout_s)
        failed = {f"{tp.topic}-{tp.partition}": str(err) for tp, err in results.items()
                  if err is not None}
        confirmed = {(tp.topic, tp.partition) for tp, err in results.items() if err is None}
        if partitions is None:
            partitions = {(m.topic(), m.partition()) for m in (*accept, *release)}
        for topic, part in partitions - confirmed:
            failed.setdefault(f"{topic}-{part}", "no result")
        self.stats["accepted"] += len(accept)
        self.stats["released"] += len(release)
        if failed:
            self.stats["commit_failures"] += 1
            return False
        return True


class _Poller:
    """Polls a pooled consumer within the task's record and time budget."""

    def __init__(self, spec: TaskSpec, pc: _pool.PooledConsumer, budget: int | None,
                 stats: Counter[str]) -> None:
        self.spec = spec
        self.pc = pc
        self.budget = budget
        self.stats = stats
        self.start = time.monotonic()
        # A consumer that just joined gets its assignment only after a heartbeat round or two.
        join = spec.options.join_timeout_ms / 1000 if pc.uses == 1 else 0.0
        self.last_record = self.start + join
        self.max_batch_s = spec.options.max_batch_duration_ms / 1000
        self.time_cap_s = max(self.max_batch_s, join + spec.options.poll_timeout_ms / 1000)
        self.deadline_s = spec.lock_ms * spec.options.lock_safety_fraction / 1000
        # Lowest offset per "topic:partition" of records acquired but not emitted (emitted
        # ones are in the END marker's tables), for AvailableNow.
        self.acquired_low: dict[str, int] = {}
        self.probe = _DrainProbe(spec)

    def note_unemitted(self, msgs: list[Any]) -> None:
        """Remember the offsets of acquired records that this task does not emit."""
        for m in msgs:
            tp = f"{m.topic()}:{m.partition()}"
            low = self.acquired_low.get(tp)
            if low is None or m.offset() < low:
                self.acquired_low[tp] = m.offset()

    def next_poll(self) -> tuple[list[Any], float] | None:
        """The next non-empty poll and its lock deadline, or None when the budget is spent."""
        opts = self.spec.options
        while True:
            now = time.monotonic()
            if self.budget is not None and self.budget <= 0:
                return None
            elapsed = now - self.start
            # maxBatchDurationMs bounds a task once records flow; a consumer still joining may
            # wait up to joinTimeoutMs + pollTimeoutMs for its first records.
            if elapsed >= self.time_cap_s or (elapsed >= self.max_batch_s
                                              and self.stats["records_acquired"] > 0):
                return None
            if now - self.last_record >= opts.poll_timeout_ms / 1000:
                return None
            # Records of this poll may have been acquired by a fetch still running since the
            # previous poll (librdkafka keeps fetching after an empty poll).
            origin = (self.pc.last_poll if self.pc.fetch_pending else now) - ACQUIRE_MARGIN_S
            wait = min(0.2, opts.poll_timeout_ms / 1000)
            msgs = list(self.pc.consumer.poll(wait))
            self.pc.last_poll = time.monotonic()
            raise_client_errors(self.pc.errors)
            self.pc.fetch_pending = not msgs
            self.stats["polls"] += 1
            if not msgs:
                if self.probe.drained(self.last_record):
                    self.stats["ended_drained"] = 1
                    return None
                continue
            if self.stats["records_acquired"] == 0 and self.pc.uses == 1:
                self.stats["join_ms"] = int((self.pc.last_poll - self.pc.created) * 1000)
            self.stats["records_acquired"] += len(msgs)
            self.last_record = self.pc.last_poll
            return msgs, origin + self.deadline_s


class _DrainProbe:
    """Ends a task early, instead of after ``pollTimeoutMs`` without records, once the share
    group's lag on every subscribed partition is 0: every record is acknowledged for good, so
    no poll can return one until new records are produced (those go to the next batch).

    Lag over-counts records other tasks still hold (they keep this task waiting, as before);
    it never under-counts. Plaintext listeners only (the protocol client); any error turns the
    probe off for the task, which then ends by the timeout.
    """

    _QUIET_S = 0.25  # no record for this long before asking
    _EVERY_S = 0.25

    def __init__(self, spec: TaskSpec) -> None:
        opts = spec.options
        conf = dict(opts.client_config)
        self.enabled = spec.topic_partitions is not None and \
            conf.get("security.protocol", "PLAINTEXT").upper() == "PLAINTEXT"
        self.spec = spec
        self.admin: Any = None
        self.last_check = 0.0

    def drained(self, last_record: float) -> bool:
        if not self.enabled:
            return False
        now = time.monotonic()
        if now - last_record < self._QUIET_S or now - self.last_check < self._EVERY_S:
            return False
        self.last_check = now
        opts = self.spec.options
        try:
            if self.admin is None:
                from pyspark_kafka_share.admin import ShareGroupAdmin

                self.admin = ShareGroupAdmin(opts.bootstrap_servers, timeout_s=min(
                    opts.broker_timeout_ms / 1000, 5.0))
            lags = [o.lag for o in self.admin.offsets(opts.group_id) if o.topic in opts.topics]
        except Exception:  # noqa: BLE001 - an optimisation only: fall back to the timeout
            self.close()
            self.enabled = False
            return False
        return len(lags) == self.spec.topic_partitions and all(lag == 0 for lag in lags)

    def close(self) -> None:
        if self.admin is not None:
            with contextlib.suppress(Exception):
                self.admin.close()
            self.admin = None


def _raise_on_errors(msgs: list[Any], acker: _Acker) -> None:
    errors = [m for m in msgs if m.error() is not None]
    if errors:
        acker.settle([], [m for m in msgs if m.error() is None])
        raise BrokerError(f"share consumer poll failed: {errors[0].error()}")


def _partitions_of(batch: pa.RecordBatch) -> set[tuple[str, int]]:
    """The distinct (topic, partition) pairs of ``batch``, without a per-row Python loop."""
    pairs = pa.Table.from_batches([batch]).group_by(["topic", "partition"]).aggregate([])
    return set(zip(pairs.column("topic").to_pylist(), pairs.column("partition").to_pylist(),
                   strict=True))


def _min_offsets(tables: list[pa.Table | pa.RecordBatch],
                 acquired: dict[str, int]) -> dict[str, int]:
    """Lowest offset per "topic:partition" among ``tables`` and ``acquired``."""
    low = dict(acquired)
    for t in tables:
        if t.num_rows == 0:
            continue
        table = t if isinstance(t, pa.Table) else pa.Table.from_batches([t])
        mins = table.group_by(["topic", "partition"]).aggregate([("offset", "min")])
        for topic, part, off in zip(mins.column("topic").to_pylist(),
                                    mins.column("partition").to_pylist(),
                                    mins.column("offset_min").to_pylist(), strict=True):
            k = f"{topic}:{part}"
            if k not in low or off < low[k]:
                low[k] = off
    return low


def read_partition(spec: TaskSpec) -> Iterator[pa.RecordBatch]:
    """The rows of input partition ``spec.part`` of micro-batch ``spec.seq``."""
    if spec.options.exactly_once:
        yield from _read_exactly_once(spec)
    else:
        yield from _read_at_most_once(spec)


def _read_exactly_once(spec: TaskSpec) -> Iterator[pa.RecordBatch]:
    opts = spec.options
    assert opts.journal_path is not None
    attempt_id, attempt_number = _attempt_identity()
    faults = _Faults(spec, attempt_number)
    journal = Journal(opts.journal_path, fsync=opts.journal_fsync)
    query_id = _query_id()
    if query_id:
        journal.claim(query_id)
    log = journal.part_log(spec.seq, spec.part)
    try:
        scan = log.open()
    except JournalClosed:
        return  # a late attempt of a batch Spark already committed: its output is unused
    own: dict[int, pa.RecordBatch] = {}
    if scan.end is None:
        scan, own = _fill(spec, journal, log, scan, attempt_id=attempt_id, faults=faults)
    faults.hit("kill-after-end")
    for slot in scan.data_slots:
        # What this attempt published is still in memory, byte for byte the slot's content.
        if slot in own:
            yield own[slot]
        else:
            yield from log.table(slot).to_batches()


def _fill(spec: TaskSpec, journal: Journal, log: PartLog, scan: ScanResult, *,
          attempt_id: int, faults: _Faults) -> tuple[ScanResult, dict[int, pa.RecordBatch]]:
    """Poll, journal and acknowledge until the budget is spent; END the log; return it and
    the batches this attempt published, by slot."""
    opts = spec.options
    stats: Counter[str] = Counter()
    own: dict[int, pa.RecordBatch] = {}
    acked_slots: list[int] = []
    existing = sum(_rows(log, s, own) for s in scan.data_slots)
    budget = None if spec.max_records is None else spec.max_records - existing
    pc = _pool.acquire(spec.consumer_config(), opts.topics, spec.idle_timeout_s)
    acker = _Acker(pc.consumer, stats, opts.broker_timeout_ms / 1000)
    poller = _Poller(spec, pc, budget, stats)
    pending: list[Any] = []
    healthy = True
    try:
        while (polled := poller.next_poll()) is not None:
            pending, deadline = polled
            _raise_on_errors(pending, acker)
            redelivered = {_key(m) for m in pending if m.delivery_count() > 1}
            stats["redelivered"] += len(redelivered)
            dups = journal.find_journaled(redelivered) if redelivered else set()
            if dups:
                fresh = [m for m in pending if _key(m) not in dups]
                dup_msgs = [m for m in pending if _key(m) in dups]
                poller.note_unemitted(dup_msgs)
            else:  # the common case: no per-record work
                fresh, dup_msgs = pending, []
            stats["duplicates_dropped"] += len(dup_msgs)
            faults.hit("fail-before-publish")
            faults.hit("sleep-before-publish")
            if time.monotonic() > deadline:
                # Past the deadline the lock may expire before the slot is visible, and the
                # record could be journaled twice. A record at the delivery limit is the
                # exception: the broker archives it instead of redelivering it, so RELEASE
                # would lose it and publishing cannot duplicate it.
                last = [m for m in fresh if m.delivery_count() >= spec.delivery_limit]
                late = [m for m in fresh if m.delivery_count() < spec.delivery_limit]
                stats["released_lock_deadline"] += len(late)
                poller.note_unemitted(late)
                acker.settle(dup_msgs, late)
                pending = last
                fresh, dup_msgs = last, []
                if not last:
                    break
            slot = None
            if fresh:
                batch = messages_to_batch(fresh, opts.include_headers)
                try:
                    slot = log.append(batch, attempt_id)
                except JournalClosed:
                    stats["released_closed"] += len(fresh)
                    poller.note_unemitted(fresh)
                    acker.settle(dup_msgs, fresh)
                    pending = []
                    break
                if journal.committed_seq() >= spec.seq:
                    # A late attempt: Spark committed this batch while we polled. The slot
                    # would never be read; withdraw it and give the records back.
                    log.withdraw(slot)
                    stats["released_closed"] += len(fresh)
                    poller.note_unemitted(fresh)
                    acker.settle(dup_msgs, fresh)
                    pending = []
                    break
                own[slot] = batch
                stats["journal_bytes"] += batch.nbytes
                faults.hit("kill-after-publish")
            known = _partitions_of(batch) if fresh and not dup_msgs else None
            confirmed = acker.settle(pending, [], known)
            pending = []
            if slot is not None and confirmed:
                acked_slots.append(slot)
            if poller.budget is not None:
                poller.budget -= len(fresh)

        faults.hit("fail-before-end")
        faults.hit("sleep-before-end")

        def marker_for(s: ScanResult) -> EndMarker:
            tables = [own[i] if i in own else log.table(i) for i in s.data_slots]
            return EndMarker(
                attempt=attempt_id, data_slots=len(s.data_slots),
                records=sum(t.num_rows for t in tables),
                acked_slots=tuple(i for i in acked_slots if i in s.data_slots),
                stats=dict(stats),
                min_offsets=_min_offsets(tables, poller.acquired_low),
            )

        return log.end(marker_for), own
    except BaseException:
        healthy = False
        if pending:
            _release_quietly(acker, pending)
        raise
    finally:
        poller.probe.close()
        _release_consumer(spec, pc, healthy)


def _release_consumer(spec: TaskSpec, pc: _pool.PooledConsumer, healthy: bool) -> None:
    if pc.fetch_pending:
        pc.idle_timeout_s = spec.pending_idle_timeout_s
    _pool.release(pc, healthy=healthy)


def _release_quietly(acker: _Acker, pending: list[Any]) -> None:
    # The original error matters more; unreleased records come back when their lock expires.
    with contextlib.suppress(Exception):
        acker.settle([], pending)


def _rows(log: PartLog, slot: int, own: dict[int, pa.RecordBatch]) -> int:
    return int(own[slot].num_rows if slot in own else log.table(slot).num_rows)


def _read_at_most_once(spec: TaskSpec) -> Iterator[pa.RecordBatch]:
    """ACCEPT on poll, then yield: a failure after the ACCEPT loses those records."""
    opts = spec.options
    stats: Counter[str] = Counter()
    attempt_id, _ = _attempt_identity()
    log = Journal(opts.journal_path, fsync=opts.journal_fsync).part_log(spec.seq, spec.part) \
        if opts.journal_path else None
    if log is not None:
        try:
            if log.open().end is not None:
                return  # a re-run batch: at-most-once keeps no records to replay
        except JournalClosed:
            return
    pc = _pool.acquire(spec.consumer_config(), opts.topics, spec.idle_timeout_s)
    acker = _Acker(pc.consumer, stats, opts.broker_timeout_ms / 1000)
    poller = _Poller(spec, pc, spec.max_records, stats)
    healthy = True
    emitted: list[pa.RecordBatch] = []
    try:
        while (polled := poller.next_poll()) is not None:
            msgs, _deadline = polled
            _raise_on_errors(msgs, acker)
            batch = messages_to_batch(msgs, opts.include_headers)
            acker.settle(msgs, [], _partitions_of(batch))
            emitted.append(batch)
            if poller.budget is not None:
                poller.budget -= len(msgs)
    except BaseException:
        healthy = False
        raise
    finally:
        poller.probe.close()
        _release_consumer(spec, pc, healthy)
    if log is not None:
        log.end(lambda s: EndMarker(attempt=attempt_id, data_slots=0,
                                    records=sum(b.num_rows for b in emitted),
                                    stats=dict(stats),
                                    min_offsets=_min_offsets(emitted, poller.acquired_low)))
    yield from emitted
