"""The exactly-once workers' transaction shape (``transaction_interval_s``) against a scripted
share consumer and transactional producer (no broker): which chunks share a transaction, that
no record is acknowledged before its transaction's commit, and what a stop or a crash between
the chunks of an open transaction does. The broker-side behaviour is in
tests/integration/test_workers_eos.py."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, cast

import pytest

from pyspark_kafka_share._kafka.share import ShareSession
from pyspark_kafka_share.errors import OptionError
from pyspark_kafka_share.workers.config import WorkerConfig, WorkerSpec
from pyspark_kafka_share.workers.exactly_once import (
    ExactlyOnce,
    MarkerLog,
    Origin,
    Transactions,
    decode_marker,
)
from pyspark_kafka_share.workers.exactly_once.markers import Overlap
from pyspark_kafka_share.workers.loop import _Worker
from pyspark_kafka_share.workers.outcome import Outcome, Record, Result
from pyspark_kafka_share.workers.phases import PHASES, Phases

from .fakes import FakeConsumer, FakeMarkerLog, FakeProducer, Msg

Event = tuple[str, ...]


class _Consumer(FakeConsumer):
    """Logs each acknowledgement into the shared ``events``."""

    def __init__(self, polls: list[list[Msg]], events: list[Event]) -> None:
        super().__init__(polls)
        self.events = events

    def acknowledge(self, m: Msg, kind: Any) -> None:
        super().acknowledge(m, kind)
        self.events.append(("ack", kind.name, str(m.offset())))


class _TxnProducer(FakeProducer):
    """A transactional producer: what a committed transaction holds, in ``committed``."""

    def __init__(self, events: list[Event]) -> None:
        super().__init__()
        self.events = events
        self.committed: list[list[tuple[str, bytes | None]]] = []
        self._open: list[tuple[str, bytes | None]] = []

    def begin_transaction(self) -> None:
        self.events.append(("begin",))
        self._open = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                headers: Any = None, on_delivery: Any = None) -> None:
        super().produce(topic, value, key, headers, on_delivery)
        self._open.append((topic, value))

    def commit_transaction(self, timeout: float) -> None:
        self.events.append(("commit",))
        self.committed.append(self._open)

    def abort_transaction(self, timeout: float) -> None:
        self.events.append(("abort",))


def _spec(**kw: Any) -> WorkerSpec:
    base: dict[str, Any] = {
        "bootstrap_servers": "unused:9092", "group": "g", "topics": ("in",),
        "chunk_size": 2, "output_topic": "out", "dead_letter_topic": "dlq",
        "time_budget_s": 1.0, "transaction_interval_s": 60.0}
    base.update(kw)
    return WorkerSpec(WorkerConfig(**base), lock_ms=30_000, delivery_limit=5)


def _worker(spec: WorkerSpec, fn: Callable[[Any], Any], polls: list[list[Msg]],
            producer: _TxnProducer | None = None, log: FakeMarkerLog | None = None) -> tuple[
        _Worker, _Consumer, _TxnProducer, list[Event]]:
    """``producer``: one of the test's (sharing ``events``), also the replacement of a
    producer after a refused produce; ``log``: the marker log (its commit check's answers)."""
    events: list[Event] = producer.events if producer is not None else []
    consumer = _Consumer(polls, events)
    txn = Transactions(producer or _TxnProducer(events), "markers", timeout_s=1.0,
                       txn_timeout_s=15.0)
    eos = ExactlyOnce(cast(MarkerLog, log or FakeMarkerLog()), txn, spec.config.client,
                      b"w0:0:x:", {}, lock_budget_s=15.0)
    if producer is not None:
        eos.replace_producer = lambda: producer  # type: ignore[method-assign]
    worker = _Worker(spec, fn, session=ShareSession(consumer, timeout_s=1.0), eos=eos)
    return worker, consumer, cast(_TxnProducer, txn.producer), events


def _echo(r: Record) -> Any:
    return Result.reject("bad") if r.offset % 5 == 4 else r.value


def _with_markers(producer: _TxnProducer) -> list[list[tuple[str, bytes | None]]]:
    """The committed transactions that carry a marker (not tombstones alone)."""
    return [t for t in producer.committed if any(k == "markers" and v for k, v in t)]


def _marked(transaction: list[tuple[str, bytes | None]]) -> dict[int, Outcome]:
    """The offsets of partition ``in``-0 the transaction's marker covers, and their outcome."""
    (value,) = [v for t, v in transaction if t == "markers" and v is not None]
    return {o: outcome for tp, spans in decode_marker(value).items()
            for s, e, outcome in spans for o in range(s, e)}


class _SlowCommit(_TxnProducer):
    """Each commit takes 60 ms."""

    def commit_transaction(self, timeout: float) -> None:
        time.sleep(0.06)
        super().commit_transaction(timeout)


def test_the_phases_of_a_transaction_are_timed_once_each() -> None:
    def slow(r: Record) -> Any:
        time.sleep(0.01)
        return r.value

    polls = [[Msg(i) for i in range(4)], [Msg(i) for i in range(4, 8)]]
    worker, _, producer, _ = _worker(_spec(), slow, polls, _SlowCommit([]))
    summary = worker.run()
    # One per poll, and the tombstones' at the end.
    n = summary["transactions"]
    assert n == len(producer.committed) >= 2 and summary["processed"] == 8
    # Commits of 60 ms: the sum holds them all, the maximum one (a sleep never ends early).
    assert summary["txn_commit_ms"] >= 60 * n and 60 <= summary["txn_commit_max_ms"] \
        <= summary["txn_commit_ms"]
    assert summary["function_ms"] >= 80 and summary["function_max_ms"] >= 20  # 2 per chunk
    # Each poll's first chunk waited for the second in the open transaction (10 ms each).
    assert summary["txn_held_max_ms"] >= 10
    for phase in PHASES:
        assert 0 <= summary[f"{phase}_max_ms"] <= summary[f"{phase}_ms"], phase


def test_the_markers_gc_reads_the_start_offsets_off_the_workers_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The GC's read of the group's start offsets (a protocol client: 1.75 s in a latency
    run, every worker's loop stalled meanwhile) runs on a thread of its own: ``due`` returns
    at once, and the markers the offsets passed are tombstoned at a later ``due``."""
    from pyspark_kafka_share._kafka import group
    from pyspark_kafka_share._kafka.partition import TopicPartition
    from pyspark_kafka_share.workers.exactly_once import encode_marker
    from pyspark_kafka_share.workers.exactly_once.transactions import GC_EVERY_S

    answer = threading.Event()

    def slow_read(settings: Any) -> dict[TopicPartition, int]:
        assert answer.wait(10)
        return {TopicPartition("in", 0): 10}

    monkeypatch.setattr(group, "read_start_offsets", slow_read)
    log = FakeMarkerLog()
    log.markers.apply(b"dead:1", encode_marker([("in", 0, 3, Outcome.ACCEPT)]))  # passed
    log.markers.apply(b"dead:2", encode_marker([("in", 0, 12, Outcome.ACCEPT)]))  # not yet
    txn = Transactions(_TxnProducer([]), "markers", timeout_s=1.0, txn_timeout_s=15.0)
    eos = ExactlyOnce(cast(MarkerLog, log), txn, _spec().config.client, b"w0:0:x:", {},
                      lock_budget_s=15.0)
    now = time.monotonic() + GC_EVERY_S
    t0 = time.monotonic()
    assert not eos.due(now) and time.monotonic() - t0 < 1.0  # the read still runs
    assert not eos.due(now + 1) and eos.tombstones == set()  # one read at a time
    answer.set()
    end = time.monotonic() + 10
    while not eos.tombstones and time.monotonic() < end:
        eos.due(now + 2)
        time.sleep(0.01)
    assert eos.tombstones == {b"dead:1"}


def test_phases_sum_exactly_and_keep_their_longest() -> None:
    stats: Counter[str] = Counter()
    phases = Phases(stats)
    for _ in range(3):
        phases.add("txn_ack", 0.0006)  # 0.6 ms: rounded down alone, 1.8 ms summed
    phases.add("txn_ack", 0.25)
    assert (stats["txn_ack_ms"], stats["txn_ack_max_ms"]) == (251, 250)


def test_the_chunks_of_a_poll_share_one_transaction_acknowledged_after_its_commit() -> None:
    worker, consumer, producer, events = _worker(_spec(), _echo, [[Msg(i) for i in range(6)]])
    summary = worker.run()
    assert summary["processed"] == 6
    (txn,) = _with_markers(producer)
    assert sorted(t for t, v in txn if v is not None) == ["dlq", "markers", *["out"] * 5]
    assert _marked(txn) == {0: Outcome.ACCEPT, 1: Outcome.ACCEPT, 2: Outcome.ACCEPT,
                            3: Outcome.ACCEPT, 4: Outcome.REJECT, 5: Outcome.ACCEPT}
    # Nothing acknowledged before the commit; all six after it.
    assert events[:2] == [("begin",), ("commit",)]
    assert sorted(e[2] for e in events[2:8]) == [str(i) for i in range(6)]
    assert consumer.acks == {i: "REJECT" if i == 4 else "ACCEPT" for i in range(6)}


def test_an_interval_of_zero_commits_each_chunk() -> None:
    spec = _spec(transaction_interval_s=0)
    worker, _, producer, events = _worker(spec, _echo, [[Msg(i) for i in range(6)]])
    worker.run()
    assert [sorted(_marked(t)) for t in _with_markers(producer)] == [[0, 1], [2, 3], [4, 5]]
    kinds = [e[0] for e in events]
    assert kinds[:12] == ["begin", "commit", "ack", "ack"] * 3


def test_a_transaction_never_spans_two_polls() -> None:
    polls = [[Msg(i) for i in range(3)], [Msg(i) for i in range(3, 6)]]
    worker, _, producer, _ = _worker(_spec(), _echo, polls)
    worker.run()
    assert [sorted(_marked(t)) for t in _with_markers(producer)] == [[0, 1, 2], [3, 4, 5]]


def test_a_stop_commits_the_open_transaction_then_releases_the_rest() -> None:
    spec = _spec(max_records=2)  # the stop comes after the first chunk
    worker, consumer, producer, events = _worker(spec, _echo, [[Msg(i) for i in range(6)]])
    summary = worker.run()
    assert [sorted(_marked(t)) for t in _with_markers(producer)] == [[0, 1]]
    assert consumer.acks == {0: "ACCEPT", 1: "ACCEPT", 2: "RELEASE", 3: "RELEASE",
                             4: "RELEASE", 5: "RELEASE"}
    assert events.index(("commit",)) < events.index(("ack", "ACCEPT", "0"))
    assert summary["released_on_stop"] == 4 and summary["stop_reason"] == "record count"


def test_a_crash_between_the_chunks_of_an_open_transaction_commits_nothing() -> None:
    def fn(r: Record) -> Any:
        if r.offset == 4:
            raise KeyboardInterrupt  # the worker dies in its third chunk
        return r.value

    worker, consumer, producer, events = _worker(_spec(), fn, [[Msg(i) for i in range(6)]])
    with pytest.raises(KeyboardInterrupt):
        worker.run()
    # Two chunks were processed in the open transaction: nothing produced, none ACCEPTed.
    assert producer.committed == [] and producer.sent == []
    assert ("begin",) not in events
    assert consumer.acks == dict.fromkeys(range(6), "RELEASE")


class _Aborting(_TxnProducer):
    """Refuses ``b"big"``; as an aborted transaction does, fails everything flushed with it
    (the marker included)."""

    def flush(self, timeout: float) -> int:
        if not any(v == b"big" for _cb, _t, v, _h in self.queue):
            return super().flush(timeout)
        for cb, _t, value, _h in self.queue:
            cb("MSG_SIZE_TOO_LARGE" if value == b"big" else "_PURGE_QUEUE", None)
        self.queue, self._open = [], []
        return 0


def test_a_refused_output_costs_only_its_own_record_an_attempt() -> None:
    def fn(r: Record) -> Any:
        return b"big" if r.offset == 3 else r.value

    producer = _Aborting([])
    worker, consumer, _, _ = _worker(_spec(), fn, [[Msg(i) for i in range(6)]], producer)
    summary = worker.run()
    # Everything flushed with it failed: halves until offset 3 is alone. 0-2 commit; 3-5 fail
    # again; 3 alone is refused and RELEASEd (a retry: its first delivery; no marker for a
    # RELEASE); 4-5 commit. The others' outputs are committed, once each.
    committed = _with_markers(producer)
    assert [sorted(_marked(t)) for t in committed] == [[0, 1, 2], [4, 5]]
    assert [v for txn in committed for t, v in txn if t in ("out", "dlq")] == [b"v"] * 5
    assert consumer.acks == {0: "ACCEPT", 1: "ACCEPT", 2: "ACCEPT", 3: "RELEASE",
                             4: "ACCEPT", 5: "ACCEPT"}
    assert summary["transactions_aborted"] == 3 and summary["outputs"] == 5


@pytest.mark.parametrize("value", [-1, 61, "0.1", True, math.nan, math.inf, None])
def test_transaction_interval_s_is_checked(value: object) -> None:
    with pytest.raises(OptionError, match=r"transaction_interval_s.*from 0 \(one transaction "
                                          r"per chunk\) to 60"):
        WorkerConfig.create(topics="in", group="g", bootstrap_servers="b:9092",
                            transaction_interval_s=value)


@pytest.mark.parametrize("value", [0, 0.1, 5])
def test_transaction_interval_s_takes_seconds(value: float) -> None:
    config = WorkerConfig.create(topics="in", group="g", bootstrap_servers="b:9092",
                                 transaction_interval_s=value)
    assert config.transaction_interval_s == value


def test_records_completed_in_flight_join_the_open_transaction() -> None:
    # Issue 40: with concurrency the completions join the open transaction as they come;
    # none is acknowledged before the commit of the transaction that holds its output.
    spec = _spec(concurrency=4, transaction_interval_s=0.05)
    polls = [[Msg(i) for i in range(12)]]
    worker, consumer, producer, events = _worker(spec, _echo, polls)
    summary = worker.run()
    assert summary["processed"] == 12
    marked = [_marked(t) for t in _with_markers(producer)]
    assert sorted(o for m in marked for o in m) == list(range(12))  # each once
    assert consumer.acks == {i: "REJECT" if i % 5 == 4 else "ACCEPT" for i in range(12)}
    for offset in range(12):  # acknowledged after the commit of its transaction
        ack = next(i for i, e in enumerate(events) if e[0] == "ack" and e[2] == str(offset))
        n = next(k for k, m in enumerate(marked) if offset in m)
        commits = [i for i, e in enumerate(events) if e == ("commit",)]
        assert commits[n] < ack
    outs = sorted(v or b"" for t in producer.committed for k, v in t if k == "out")
    assert outs == [b"v"] * 10


def test_a_crash_in_flight_commits_nothing_of_the_open_transaction() -> None:
    def fn(r: Record) -> Any:
        if r.offset == 7:
            raise KeyboardInterrupt  # the worker dies with records in flight
        return r.value

    spec = _spec(concurrency=4, chunk_size=1)
    worker, consumer, producer, _ = _worker(spec, fn, [[Msg(i) for i in range(8)]])
    with pytest.raises(KeyboardInterrupt):
        worker.run()
    assert producer.committed == [] and producer.sent == []
    assert consumer.acks == dict.fromkeys(range(8), "RELEASE")


def _others(offsets: set[int]) -> Callable[[Sequence[Origin]], list[Overlap]]:
    """A commit check that finds another attempt's marker over ``offsets`` of ``in``-0."""

    def check(origins: Sequence[Origin]) -> list[Overlap]:
        n = sum(1 for _t, _p, o, _ in origins if o in offsets)
        return [Overlap(b"1:0:y:7", 42, n)] if n else []

    return check


def test_another_attempts_marker_over_a_transactions_records_aborts_it() -> None:
    # Issue 37: records 2-3 were handed to another worker too (an acquisition lost with nobody
    # told), whose marker the check finds between the barrier and this transaction's own.
    log = FakeMarkerLog(_others({3}))
    worker, consumer, producer, events = _worker(_spec(transaction_interval_s=0), _echo,
                                                 [[Msg(i) for i in range(6)]], log=log)
    summary = worker.run()
    # Each transaction was checked with its records' origins, after its produce.
    assert [sorted(o for _t, _p, o, _ in c) for c in log.checked] == [[0, 1], [2, 3], [4, 5]]
    # Its transaction aborted and RELEASEd (never ACCEPTed); the others committed.
    assert [sorted(_marked(t)) for t in _with_markers(producer)] == [[0, 1], [4, 5]]
    assert consumer.acks == {0: "ACCEPT", 1: "ACCEPT", 2: "RELEASE", 3: "RELEASE",
                             4: "REJECT", 5: "ACCEPT"}
    assert events[4:7] == [("begin",), ("abort",), ("ack", "RELEASE", "2")]
    assert (summary["marker_overlaps_aborted"], summary["transactions_aborted"]) == (1, 1)


def test_a_check_that_cannot_read_to_its_own_marker_aborts() -> None:
    log = FakeMarkerLog(lambda origins: None)
    worker, consumer, producer, _ = _worker(_spec(), _echo, [[Msg(i) for i in range(4)]],
                                            log=log)
    summary = worker.run()
    assert _with_markers(producer) == [] and len(log.checked) == 1
    assert consumer.acks == dict.fromkeys(range(4), "RELEASE")
    # Aborted, but no overlap was seen: not counted as one.
    assert (summary.get("marker_overlaps_aborted", 0), summary["transactions_aborted"]) == \
        (0, 1)
