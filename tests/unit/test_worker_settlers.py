"""The two settlers the worker loop hands its results to, each against fakes (no broker).

The transactional settler's refused-produce bisection branch by branch: the delivered records
commit in a new transaction, the refused ones are halved until alone, a record refused alone
has its verdict changed and is tried once more, a marker or a tombstone refused alone, a commit
of unknown outcome, an abortable commit, a commit too close to the poll's deadline, a fenced
producer; with the native client, the commit check's RENEW (confirmed, refused). The
at-least-once settler: what it produces before it acknowledges, and a refused output or dead
letter. The loops around them: test_worker_loop.py, test_worker_transactions.py.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError

from pyspark_kafka_share._kafka.native.adapter import NativeMessage, NativeSession
from pyspark_kafka_share._kafka.native.consumer import NativeShareConsumer, ShareRecord
from pyspark_kafka_share._kafka.share import ShareSession
from pyspark_kafka_share.errors import BrokerError, ErrorCode
from pyspark_kafka_share.workers.config import WorkerConfig, WorkerSpec
from pyspark_kafka_share.workers.exactly_once import (
    ExactlyOnce,
    MarkerLog,
    Transactions,
    decode_marker,
)
from pyspark_kafka_share.workers.exactly_once.settler import TransactionalSettler
from pyspark_kafka_share.workers.outcome import Outcome
from pyspark_kafka_share.workers.settle import AtLeastOnceSettler, Poll
from pyspark_kafka_share.workers.verdict import Final, Verdict

from .fakes import FakeConsumer, FakeMarkerLog, FakeNative, FakeProducer, Msg

Sent = tuple[str, bytes | None, bytes | None]  # topic, key, value
Refuse = Callable[[str, bytes | None], bool]


def _kafka_error(name: str, *, fatal: bool = False, abortable: bool = False) -> KafkaError:
    """confluent-kafka's own ``KafkaError`` of that name, as the transactions are given it."""
    return KafkaError(getattr(KafkaError, name), fatal=fatal, txn_requires_abort=abortable)


class _TxnProducer:
    """A transactional producer: ``refuse(topic, value)`` refuses a record; with ``purge`` the
    records flushed beside a refused one fail too (as an aborted transaction's do).
    ``commits``: the errors the next commits raise (none: they succeed); ``error``: what a
    refused record is told (its own fault by default)."""

    def __init__(self, refuse: Refuse = lambda t, v: False, *, purge: bool = False,
                 commits: list[KafkaError] | None = None,
                 error: str = "MSG_SIZE_TOO_LARGE") -> None:
        self.refuse, self.purge, self.commits = refuse, purge, list(commits or ())
        self.error = _kafka_error(error)
        self.committed: list[list[Sent]] = []
        self.events: list[str] = []
        self._queue: list[tuple[Any, Sent]] = []
        self._open: list[Sent] = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                headers: Any = None, on_delivery: Any = None) -> None:
        self._queue.append((on_delivery, (topic, key, value)))

    def flush(self, timeout: float) -> int:
        refused = any(self.refuse(t, v) for _, (t, _k, v) in self._queue)
        for cb, (topic, key, value) in self._queue:
            if self.refuse(topic, value):
                cb(self.error, None)
            elif refused and self.purge:
                cb(_kafka_error("_PURGE_QUEUE"), None)
            else:
                self._open.append((topic, key, value))
                cb(None, None)
        self._queue = []
        return 0

    def poll(self, timeout: float) -> int:
        return 0

    def begin_transaction(self) -> None:
        self.events.append("begin")
        self._open = []

    def commit_transaction(self, timeout: float) -> None:
        self.events.append("commit")
        if self.commits:
            raise RuntimeError(self.commits.pop(0))
        self.committed.append(self._open)

    def abort_transaction(self, timeout: float) -> None:
        self.events.append("abort")


class _Eos(ExactlyOnce):
    """Replacing the producer keeps the fake (a real one would connect)."""

    def replace_producer(self) -> Any:
        return self.txn.producer


def _spec(**kw: Any) -> WorkerSpec:
    base: dict[str, Any] = {"bootstrap_servers": "unused:9092", "group": "g",
                            "topics": ("in",), "output_topic": "out",
                            "dead_letter_topic": "dlq", "max_attempts": 3}
    base.update(kw)
    return WorkerSpec(WorkerConfig(**base), lock_ms=30_000, delivery_limit=5)


def _poll(consumer: FakeConsumer, stats: Counter[str], deadline_s: float = 30.0) -> Poll:
    return Poll(ShareSession(consumer, timeout_s=1.0), stats, time.monotonic() + deadline_s)


def _transactional(producer: _TxnProducer, spec: WorkerSpec | None = None) -> tuple[
        TransactionalSettler, FakeConsumer, _Eos]:
    spec = spec or _spec()
    txn = Transactions(producer, "markers", timeout_s=1.0, txn_timeout_s=15.0)
    eos = _Eos(cast(MarkerLog, FakeMarkerLog()), txn, spec.config.client, b"w0:0:x:", {},
               lock_budget_s=15.0)
    return TransactionalSettler(spec, Counter(), eos, index=0, attempt=0), \
        FakeConsumer([]), eos


def _final(n: int, *, dc: int = 1, reject: frozenset[int] = frozenset()) -> list[Final]:
    """``n`` records: outputs ``o<i>``, or REJECTs (dead letters) for the offsets in
    ``reject``."""
    return [(Msg(i, dc=dc), Outcome.REJECT, Verdict(Outcome.REJECT, error="bad"))
            if i in reject else (Msg(i, dc=dc), Outcome.ACCEPT, Verdict(Outcome.ACCEPT, b"o%d" % i))
            for i in range(n)]


def _settle(settler: TransactionalSettler, final: list[Final], poll: Poll) -> None:
    settler.settle(final, poll, poll_ends=True, began=time.monotonic())


def _marked(producer: _TxnProducer) -> list[list[int]]:
    """Per committed transaction with a marker, the offsets it covers."""
    return [sorted(o for spans in decode_marker(v).values() for s, e, _ in spans
                   for o in range(s, e))
            for txn in producer.committed for t, _k, v in txn if t == "markers" and v]


def test_one_transaction_then_the_acknowledgements() -> None:
    producer = _TxnProducer()
    settler, consumer, eos = _transactional(producer)
    _settle(settler, _final(3, reject=frozenset({1})), _poll(consumer, settler.stats))
    (txn,) = producer.committed
    assert sorted(t for t, _k, _v in txn) == ["dlq", "markers", "out", "out"]
    assert _marked(producer) == [[0, 1, 2]]
    assert consumer.acks == {0: "ACCEPT", 1: "REJECT", 2: "ACCEPT"}
    assert settler.stats["transactions"] == 1 and settler.stats["outputs"] == 2
    assert len(eos.mine) == 0 and len(eos.tombstones) == 1  # acknowledged: tombstone due


def test_the_delivered_records_commit_in_a_new_transaction() -> None:
    """Only offset 3 fails: 0-2 and 4-5 commit together; 3 alone is refused, becomes a retry
    (RELEASE, its first delivery) and settles without a marker."""
    producer = _TxnProducer(lambda t, v: v == b"o3")
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(6), _poll(consumer, settler.stats))
    assert _marked(producer) == [[0, 1, 2, 4, 5]]
    assert consumer.acks == {**dict.fromkeys((0, 1, 2, 4, 5), "ACCEPT"), 3: "RELEASE"}
    assert producer.events.count("abort") == 2  # all six, then 3 alone
    assert (settler.stats["transactions_aborted"], settler.stats["produce_failures"],
            settler.stats["producers_replaced"]) == (2, 2, 2)


def test_the_refused_records_are_halved_until_alone() -> None:
    """Everything flushed with offset 2 fails: 0-3, then 0-1 (committed) and 2-3 (failed),
    then 2 alone (refused: a retry) and 3 (committed)."""
    producer = _TxnProducer(lambda t, v: v == b"o2", purge=True)
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(4), _poll(consumer, settler.stats))
    assert _marked(producer) == [[0, 1], [3]]
    assert consumer.acks == {0: "ACCEPT", 1: "ACCEPT", 2: "RELEASE", 3: "ACCEPT"}
    assert settler.stats["transactions_aborted"] == 3
    assert [v for txn in producer.committed for t, _k, v in txn if t == "out"] == \
        [b"o0", b"o1", b"o3"]  # each output committed once


def test_a_dead_letter_refused_twice_on_its_last_delivery_fails_the_worker() -> None:
    producer = _TxnProducer(lambda t, v: t == "dlq")
    settler, consumer, _ = _transactional(producer)
    with pytest.raises(BrokerError, match="did not take record in-0@0 on its last delivery "
                                          "in two transactions"):
        _settle(settler, _final(1, dc=5, reject=frozenset({0})), _poll(consumer, settler.stats))
    assert producer.committed == [] and consumer.acks == {}


def test_a_record_refused_twice_is_released() -> None:
    """Offset 0's output is refused on its last attempt: poison; its dead letter is refused
    too (below the delivery limit): RELEASEd."""
    producer = _TxnProducer(lambda t, v: t in ("out", "dlq"))
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(1, dc=3), _poll(consumer, settler.stats))
    assert consumer.acks == {0: "RELEASE"} and producer.committed == []
    assert settler.stats["exhausted"] == 1 and settler.stats["transactions_aborted"] == 2


def test_a_marker_refused_alone_releases_every_record() -> None:
    producer = _TxnProducer(lambda t, v: t == "markers" and v is not None)
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(3), _poll(consumer, settler.stats))
    assert producer.committed == [] and producer.events == ["begin", "abort"]
    assert consumer.acks == dict.fromkeys(range(3), "RELEASE")
    assert settler.stats["produce_failures"] == 1
    assert settler.failures.streak == 1  # a refusal, counted towards failing the worker


def test_a_tombstone_refused_releases_the_records_and_stays_due() -> None:
    producer = _TxnProducer(lambda t, v: t == "markers" and v is None)
    settler, consumer, eos = _transactional(producer)
    eos.tombstones.add(b"old")
    _settle(settler, _final(2), _poll(consumer, settler.stats))
    assert producer.committed == [] and consumer.acks == {0: "RELEASE", 1: "RELEASE"}
    assert eos.tombstones == {b"old"}


def test_tombstones_alone_while_idle() -> None:
    producer = _TxnProducer()
    settler, _, eos = _transactional(producer)
    eos.tombstones.add(b"old")
    eos.last_txn -= 60.0
    settler.idle()
    assert producer.committed == [[("markers", b"old", None)]]
    assert eos.tombstones == set() and settler.stats["transactions"] == 1


def test_a_commit_of_unknown_outcome_releases_and_replaces_the_producer() -> None:
    producer = _TxnProducer(commits=[_kafka_error("_TIMED_OUT")])
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(2), _poll(consumer, settler.stats))
    assert consumer.acks == {0: "RELEASE", 1: "RELEASE"}
    assert "abort" not in producer.events  # left to the new producer's init_transactions
    assert (settler.stats["transactions_aborted"], settler.stats["producers_replaced"]) == (1, 1)
    assert settler.failures.streak == 0 and settler.stop_reason is None


def test_an_abortable_commit_is_aborted_and_released() -> None:
    producer = _TxnProducer(commits=[_kafka_error("_STATE", abortable=True)])
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(2), _poll(consumer, settler.stats))
    assert producer.events == ["begin", "commit", "abort"]
    assert consumer.acks == {0: "RELEASE", 1: "RELEASE"}
    assert (settler.stats["transactions_aborted"], settler.stats["producers_replaced"]) == (1, 0)


def test_no_commit_too_close_to_the_polls_deadline() -> None:
    producer = _TxnProducer()
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(2), _poll(consumer, settler.stats, deadline_s=0.1))
    assert producer.events == ["begin", "abort"]
    assert consumer.acks == {0: "RELEASE", 1: "RELEASE"}


class _SlowFirstCommit(_TxnProducer):
    """The first commit takes ``first_s`` (a transaction coordinator's failover), the
    others no time."""

    def __init__(self, first_s: float) -> None:
        super().__init__()
        self.first_s = first_s

    def commit_transaction(self, timeout: float) -> None:
        if not self.committed:
            time.sleep(self.first_s)
        super().commit_transaction(timeout)


def test_one_slow_commit_does_not_refuse_every_later_one() -> None:
    """A commit that took 1.2 s makes the commit check ask for 2.4 s of the lock (twice the
    commits' average), more than a 2 s poll leaves: that poll's transaction is aborted, but
    not every later one (the average, refreshed only by commits, stayed put and every
    delivery of the records was aborted until the broker archived them): the refusal halves
    it and the next poll's records commit."""
    producer = _SlowFirstCommit(1.2)
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(2), _poll(consumer, settler.stats))
    assert len(producer.committed) == 1
    outcomes = []
    for dc in range(2, 6):  # the records' deliveries 2 to 5 (the limit: then archived)
        consumer.acks.clear()
        _settle(settler, _final(2, dc=dc), _poll(consumer, settler.stats, deadline_s=2.0))
        outcomes.append(consumer.acks[0])
    assert outcomes == ["RELEASE", "ACCEPT", "ACCEPT", "ACCEPT"], outcomes
    assert settler.stats["transactions_aborted"] == 1


def test_a_fenced_producer_stops_the_worker() -> None:
    producer = _TxnProducer(commits=[_kafka_error("PRODUCER_FENCED", fatal=True)])
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(2), _poll(consumer, settler.stats))
    assert consumer.acks == {0: "RELEASE", 1: "RELEASE"}
    assert settler.stop_reason is not None and settler.stop_reason.startswith("fenced")
    assert settler.stats["producers_replaced"] == 0


def test_chunks_are_held_until_the_poll_ends() -> None:
    producer = _TxnProducer()
    settler, consumer, _ = _transactional(producer)
    poll = _poll(consumer, settler.stats)
    settler.settle(_final(2), poll, poll_ends=False, began=time.monotonic())
    assert producer.events == [] and [m.offset() for m in settler.pending()] == [0, 1]
    settler.settle([], poll, poll_ends=True, began=time.monotonic())  # all decided already
    assert _marked(producer) == [[0, 1]] and settler.pending() == []


def _at_least_once(refuse: Refuse = lambda t, v: False) -> tuple[
        AtLeastOnceSettler, FakeConsumer, FakeProducer]:
    producer = FakeProducer(refuse)
    return AtLeastOnceSettler(_spec(), Counter(), producer), FakeConsumer([]), producer


def test_at_least_once_produces_then_acknowledges() -> None:
    settler, consumer, producer = _at_least_once()
    settler.settle(_final(3, reject=frozenset({2})), _poll(consumer, settler.stats),
                   poll_ends=True, began=time.monotonic())
    assert [(t, v) for t, v, _h in producer.sent] == [("out", b"o0"), ("out", b"o1"),
                                                      ("dlq", b"v")]
    assert consumer.acks == {0: "ACCEPT", 1: "ACCEPT", 2: "REJECT"}
    assert (settler.stats["outputs"], settler.stats["dead_lettered"]) == (2, 1)


def test_at_least_once_releases_a_refused_output_or_dead_letter() -> None:
    settler, consumer, _ = _at_least_once(lambda t, v: v == b"o0" or t == "dlq")
    settler.settle(_final(3, reject=frozenset({2})), _poll(consumer, settler.stats),
                   poll_ends=True, began=time.monotonic())
    assert consumer.acks == {0: "RELEASE", 1: "ACCEPT", 2: "RELEASE"}
    assert settler.stats["produce_failures"] == 2 and settler.failures.streak == 1


def test_at_least_once_fails_after_three_chunks_of_failures() -> None:
    settler, consumer, _ = _at_least_once(lambda t, v: True)
    for i in range(2):
        settler.settle([_final(i + 1)[i]], _poll(consumer, settler.stats), poll_ends=True,
                       began=time.monotonic())
    with pytest.raises(BrokerError, match="failed in 3 chunks in a row"):
        settler.settle([_final(3)[2]], _poll(consumer, settler.stats), poll_ends=True,
                       began=time.monotonic())


class _RenewSeesFlush(FakeNative):
    """A native consumer that notes, at each RENEW, what the producer's open transaction
    holds then (whether the marker was flushed before the renewal)."""

    def __init__(self, producer: _TxnProducer, renew_code: int) -> None:
        super().__init__([], renew_code=renew_code)
        self.producer, self.flushed_at_renew = producer, list[list[Sent]]()

    def commit_sync(self) -> dict[tuple[str, int], int]:
        if any(kind == "RENEW" for _, kind in self.queued):
            self.flushed_at_renew.append(list(self.producer._open))
        return super().commit_sync()


def _native_transaction(renew_code: int) -> tuple[TransactionalSettler, _TxnProducer,
                                                   _RenewSeesFlush]:
    """Two records of a native poll settled in one transaction."""
    producer = _TxnProducer()
    settler, _, _ = _transactional(producer)
    native = _RenewSeesFlush(producer, renew_code)
    poll = Poll(NativeSession(cast(NativeShareConsumer, native)), settler.stats,
                time.monotonic() + 30)
    final: list[Final] = [(NativeMessage(_native_record(i)), Outcome.ACCEPT,
                           Verdict(Outcome.ACCEPT, b"o%d" % i)) for i in range(2)]
    _settle(settler, final, poll)
    return settler, producer, native


def _native_record(offset: int) -> ShareRecord:
    return ShareRecord("in", 0, offset, 1, None, b"v", (), 1, time.monotonic() + 30)


def test_a_native_commit_check_renews_the_records_once_the_marker_is_flushed() -> None:
    """With the native client the commit check asks the leader: a RENEW of the transaction's
    records, sent after the marker is in the log and confirmed, proves the acquisitions were
    still this worker's then (a leader change or an expired session would fail it)."""
    settler, producer, native = _native_transaction(renew_code=0)
    assert producer.events == ["begin", "commit"] and _marked(producer) == [[0, 1]]
    assert [sum(t == "markers" for t, _, _ in txn) for txn in native.flushed_at_renew] == [1]
    assert native.acks == {0: "ACCEPT", 1: "ACCEPT"}
    assert (settler.stats["renewed"], settler.stats["renew_failures"]) == (2, 0)


def test_a_native_commit_the_leader_no_longer_holds_is_aborted_and_released() -> None:
    """The leader moved or the session expired unseen by the producer and the marker reader:
    the RENEW fails, so the transaction is aborted and its records RELEASEd, not committed."""
    settler, producer, native = _native_transaction(renew_code=ErrorCode.INVALID_RECORD_STATE)
    assert producer.events == ["begin", "abort"] and producer.committed == []
    assert native.acks == {0: "RELEASE", 1: "RELEASE"}
    assert settler.stats["transactions_aborted"] == 1
    assert (settler.stats["renewed"], settler.stats["renew_failures"]) == (0, 2)


def test_after_a_missed_barrier_the_worker_polls_once_the_marker_topic_is_read(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A barrier that missed its deadline (a transaction left open on the marker topic)
    RELEASEs the poll; the next poll waits until the marker topic is read to its end (each
    poll would acquire the records again, a delivery each), or until the open transaction's
    timeout (the lock budget) and the broker's sweep have passed since the miss."""
    settler, consumer, eos = _transactional(_TxnProducer())
    reads = [False, False, False, True]  # admit's barrier, then idle's reads
    barriers: list[bool] = []

    def catch_up(until: float, *, barrier: bool = False) -> bool:
        barriers.append(barrier)
        return reads.pop(0)

    slept: list[float] = []
    monkeypatch.setattr(eos.log, "catch_up", catch_up)
    monkeypatch.setattr(time, "sleep", slept.append)
    assert settler.admit([Msg(0), Msg(1)], _poll(consumer, settler.stats)) == []
    assert consumer.acks == {0: "RELEASE", 1: "RELEASE"}
    assert settler.stats["released_marker_wait"] == 2
    assert [settler.idle(), settler.idle(), settler.idle(), settler.idle()] == \
        [False, False, True, True]
    assert barriers == [True, False, False, False]  # none once read: polls go on
    # A read that failed at once waits out the rest of its second: no spin.
    assert len(slept) == 2 and all(0.5 < s <= 1.0 for s in slept)
    reads[:] = [False, False]
    settler.admit([Msg(2)], _poll(consumer, settler.stats))
    assert settler.missed_at is not None
    settler.missed_at -= eos.lock_budget_s + 10.5  # the transaction's timeout and the sweep
    assert settler.idle() and settler.missed_at is None


@pytest.mark.parametrize(("error", "dc", "ack"), [
    ("MSG_SIZE_TOO_LARGE", 3, "REJECT"),  # its own, on its last attempt (max_attempts 3)
    ("_MSG_TIMED_OUT", 3, "RELEASE"),  # a broker fault: no attempt spent
    ("_MSG_TIMED_OUT", 5, "REJECT"),  # ... but on the broker's last delivery, a dead letter
])
def test_an_output_refused_alone_is_poison_for_its_own_fault_only(
        error: str, dc: int, ack: str) -> None:
    producer = _TxnProducer(lambda t, v: t == "out", error=error)
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(1, dc=dc), _poll(consumer, settler.stats))
    assert consumer.acks == {0: ack}
    dead = [x for txn in producer.committed for x in txn if x[0] == "dlq"]
    assert len(dead) == (ack == "REJECT")
