"""The transactions of the exactly-once workers.

- :class:`Transactions`: the worker slot's transactional producer (``transactional.id`` per
  worker index, so a newer attempt of the same slot fences the older one at the broker); a
  failed commit or abort raises :class:`~pyspark_kafka_share.errors.TransactionFailed`, a
  fenced producer :class:`~pyspark_kafka_share.errors.Fenced`.
- :class:`ExactlyOnce`: one worker's exactly-once state: its marker reader, its transactional
  producer, the markers it committed whose acknowledgement is not yet confirmed, and the
  tombstones due (a marker is tombstoned once the acknowledgement of every record it covers is
  confirmed, or once the group's share-partition start offsets passed all of them).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share.errors import (
    Fenced,
    TransactionFailed,
    from_client_error,
    is_fenced,
    kafka_error,
)
from pyspark_kafka_share.workers.exactly_once.markers import (
    MarkerLog,
    Origin,
    attempt_prefix,
    encode_marker,
    marker_key,
    marker_topic,
)
from pyspark_kafka_share.workers.outcome import Outcome

__all__ = ["GC_EVERY_S", "TOMBSTONE_IDLE_S", "ExactlyOnce", "Transactions", "transactional_id"]


def transactional_id(group: str, worker: int) -> str:
    """The ``transactional.id`` of worker slot ``worker`` of ``group``: every attempt of the
    slot uses it, so the broker fences all but the newest."""
    return f"kafka-share-workers.{group}.{worker}"




@dataclass(eq=False)
class Transactions:
    """The worker slot's transactional producer (outputs, dead letters, markers)."""

    producer: Any
    topic: str
    timeout_s: float
    txn_timeout_s: float
    errors: list[Any] = field(default_factory=list)
    open: bool = False
    began: float = 0.0
    commit_s: float = 0.0  # moving average of commit_transaction's time

    @classmethod
    def start(cls, conf: dict[str, Any], txn_id: str, topic: str, lock_budget_s: float,
              timeout_s: float) -> Transactions:
        """``init_transactions`` as ``txn_id``: the broker aborts what an older attempt of the
        slot left open and fences it. The transaction timeout is the lock budget, so a
        transaction left open by a dead worker holds the other workers' barriers no longer."""
        from confluent_kafka import Producer

        errors: list[Any] = []
        budget_ms = max(1000, int(lock_budget_s * 1000))
        producer = Producer({**conf, "transactional.id": txn_id, "error_cb": errors.append,
                             "transaction.timeout.ms": budget_ms,
                             "message.timeout.ms": min(budget_ms,
                                                       int(conf.get("message.timeout.ms",
                                                                    budget_ms)))})
        try:
            producer.init_transactions(timeout_s)
        except Exception as exc:
            raise from_client_error(exc, f"the transactional producer {txn_id!r} could not "
                                    "start", "Grant the workers' principal WRITE on transactional "
                                    "ids with this prefix (DESCRIBE is implied)") from exc
        return cls(producer, topic, timeout_s, budget_ms / 1000, errors)

    def begin(self) -> None:
        self.producer.begin_transaction()
        self.open = True
        self.began = time.monotonic()

    def commit(self, inject: Callable[[Any, float], None] | None = None) -> None:
        """Commit the open transaction; :class:`TransactionFailed` if it did not (abortable:
        aborted; outcome unknown: left to the marker check), :class:`BrokerError` if this
        producer was fenced by a newer attempt of its worker slot. ``inject``: a test's
        ``commit_transaction`` (``Faults.commit``)."""
        t0 = time.monotonic()
        try:
            if inject is not None:
                inject(self.producer, self.timeout_s)
            else:
                self.producer.commit_transaction(self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - judged by _failed
            self._failed(exc, "commit")
        finally:
            self.open = False
        took = time.monotonic() - t0
        self.commit_s = took if self.commit_s == 0 else 0.7 * self.commit_s + 0.3 * took

    def abort(self, why: str) -> None:
        if not self.open:
            return
        self.open = False
        try:
            self.producer.abort_transaction(self.timeout_s)
        except Exception as exc:  # noqa: BLE001 - judged below
            self._failed(exc, f"abort ({why})")

    def _failed(self, exc: Exception, what: str) -> None:
        err = kafka_error(exc)
        fatal = bool(getattr(err, "fatal", lambda: False)())
        # The broker also fences a producer whose transaction outlived transaction.timeout.ms:
        # that one is replaced; one fenced sooner was fenced by a newer attempt of its slot.
        timed_out = time.monotonic() - self.began >= self.txn_timeout_s
        if fatal and is_fenced(err) and not timed_out:
            raise Fenced(f"fenced: the transactional producer failed fatally during {what}: "
                         f"{err} (a newer attempt of this worker slot took over its "
                         "transactional.id; this attempt stops)") from exc
        requires_abort = bool(getattr(err, "txn_requires_abort", lambda: False)())
        if requires_abort:
            with contextlib.suppress(Exception):
                self.producer.abort_transaction(self.timeout_s)
        # Neither abortable nor fatal (a timeout, a lost reply): the outcome is unknown and the
        # producer is left inside the commit; a new producer's init_transactions completes or
        # aborts it (so the marker, in the same transaction, tells a redelivery which).
        raise TransactionFailed(f"{what} failed: {err}", fatal=fatal or not requires_abort) \
            from exc

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.open:
                self.producer.abort_transaction(self.timeout_s)
        with contextlib.suppress(Exception):
            self.producer.flush(1)


def _transactions(settings: ClientSettings, producer_conf: dict[str, Any], worker: int,
                  lock_budget_s: float) -> Transactions:
    return Transactions.start(producer_conf, transactional_id(settings.group_id, worker),
                              marker_topic(settings.group_id), lock_budget_s,
                              settings.timeout_s)


_LOST = frozenset({"_TRANSPORT", "_ALL_BROKERS_DOWN", "_FATAL", "_FENCED", "_UNKNOWN_GROUP"})
GC_EVERY_S = 30.0
TOMBSTONE_IDLE_S = 1.0


@dataclass(eq=False)
class ExactlyOnce:
    """One worker's exactly-once state: its marker reader, its transactional producer, the
    markers it committed whose acknowledgement is not yet confirmed, and the tombstones due."""

    log: MarkerLog
    txn: Transactions
    settings: ClientSettings
    prefix: bytes
    producer_conf: dict[str, Any] = field(repr=False)
    worker: int = 0
    lock_budget_s: float = 0.0
    seq: int = 0
    mine: dict[bytes, set[TopicPartition]] = field(default_factory=dict)
    tombstones: set[bytes] = field(default_factory=set)
    last_txn: float = field(default_factory=time.monotonic)
    last_gc: float = field(default_factory=time.monotonic)
    _sent: set[bytes] = field(default_factory=set)  # tombstones of the open transaction
    # The group's start offsets as the GC's thread read them (None: could not), once read.
    _starts: list[dict[TopicPartition, int] | None] = field(default_factory=list)
    _reading: bool = False

    @classmethod
    def start(cls, settings: ClientSettings, producer_conf: dict[str, Any], worker: int,
              attempt: int, lock_budget_s: float) -> ExactlyOnce:
        prefix = attempt_prefix(worker, attempt)
        txn = _transactions(settings, producer_conf, worker, lock_budget_s)
        log: MarkerLog | None = None
        try:
            log = MarkerLog.open(settings, prefix)
            log.catch_up(time.monotonic() + settings.timeout_s)  # the first read: all of it
            log.before = (dict(log.seen), dict(log.seen))  # before any record was acquired
        except BaseException:
            txn.close()
            if log is not None:
                log.close()
            raise
        return cls(log, txn, settings, prefix, producer_conf, worker, lock_budget_s)

    def replace_producer(self) -> Any:
        """A new transactional producer for the slot (the old one failed fatally, e.g. its
        transaction state was lost with a broker restart); ``init_transactions`` again."""
        self.txn.close()
        self.txn = _transactions(self.settings, self.producer_conf, self.worker,
                                 self.lock_budget_s)
        self._sent = set()
        return self.txn.producer

    def new_poll(self) -> None:
        """A poll returned records: client errors from here on mean the acquisitions may be
        lost (:meth:`session_lost`)."""
        self.log.errors.clear()
        self.txn.errors.clear()

    def session_lost(self) -> str | None:
        """A connection loss or fatal error the worker's clients reported since the poll."""
        with contextlib.suppress(Exception):
            self.txn.producer.poll(0)  # serves the error callbacks queued meanwhile
        for e in (*self.log.errors, *self.txn.errors):
            if e.fatal() or e.name() in _LOST:
                return f"{e.name()}: {e.str()}"
        return None

    def decided(self, m: Any) -> Outcome | None:
        return self.log.markers.lookup(m.topic(), m.partition(), m.offset())

    def next_marker(self, origins: Sequence[Origin]) -> tuple[bytes, bytes]:
        """The next transaction's marker (key, value)."""
        self.seq += 1
        return marker_key(self.prefix, self.seq), encode_marker(origins)

    def committed(self, key: bytes | None, origins: Sequence[Origin]) -> None:
        """The transaction of marker ``key`` (None: tombstones alone) was committed."""
        self.last_txn = time.monotonic()
        if key is not None:
            self.mine[key] = {TopicPartition(t, p) for t, p, _, _ in origins}
        self.tombstones.difference_update(self._sent)
        self._sent = set()

    def confirmed(self, key: bytes, partitions: Iterable[TopicPartition]) -> None:
        """The acknowledgement of these partitions' records was confirmed: a marker whose every
        partition is confirmed is tombstoned in the next transaction."""
        need = self.mine.get(key)
        if need is not None and need <= set(partitions):
            del self.mine[key]
            self.tombstones.add(key)

    def take_tombstones(self) -> list[bytes]:
        """The tombstones the next transaction carries (dropped from the queue at commit)."""
        self._sent = set(self.tombstones)
        return sorted(self._sent)

    def due(self, now: float) -> bool:
        """Whether a transaction of tombstones alone is due (the worker is idle). Every
        ``GC_EVERY_S`` the group's start offsets are read on a thread of their own; once read,
        the markers they passed are tombstoned (:meth:`_collect`)."""
        if now - self.last_gc >= GC_EVERY_S and not self._reading:
            self.last_gc = now
            self._read_starts()
        if self._starts:
            self._collect(self._starts.pop())
        return bool(self.tombstones) and now - self.last_txn >= TOMBSTONE_IDLE_S

    def _read_starts(self) -> None:
        """Read the group's start offsets off the worker's thread: a protocol client of its
        own (connections, the group's coordinator, a describe), which the worker's loop would
        wait for before its next poll. Nothing of the worker's is touched there."""
        from pyspark_kafka_share._kafka.group import read_start_offsets

        def read() -> None:
            try:
                self._starts.append(read_start_offsets(self.settings))
            finally:
                self._reading = False

        self._reading = True
        threading.Thread(target=read, daemon=True, name="kafka-share-marker-gc").start()

    def _collect(self, starts: dict[TopicPartition, int] | None) -> None:
        """Tombstone the markers whose records ``starts`` (the group's share-partition start
        offsets, read a moment ago) passed: those records are acknowledged or archived and never
        delivered again (left by dead workers). Start offsets only grow, so offsets read
        before the markers applied since are only the more conservative. The markers read
        so far: each poll's barrier reads the new ones."""
        if starts:
            self.tombstones.update(k for k in self.log.markers.passed(starts)
                                   if k not in self.mine)

    def close(self) -> None:
        self.txn.close()
        self.log.close()

