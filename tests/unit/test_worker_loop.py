"""The queue worker's poll loop against a scripted consumer and producer (no broker).

These cover the paths a real broker makes hard to reach on purpose: a dead-letter topic that
refuses a record on its last delivery, a producer that keeps failing, a function returning
nonsense, stops and lock deadlines in the middle of a poll. Integration tests cover the same
loop end to end (tests/integration/test_workers.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from pyspark_kafka_share._kafka.share import ShareSession
from pyspark_kafka_share.errors import BrokerError
from pyspark_kafka_share.workers.config import WorkerConfig, WorkerSpec
from pyspark_kafka_share.workers.loop import _Worker
from pyspark_kafka_share.workers.outcome import Outcome, Record, Result

from .fakes import FakeConsumer, FakeProducer, Msg


def _spec(*, lock_ms: int = 30_000, delivery_limit: int = 5, **kw: Any) -> WorkerSpec:
    base: dict[str, Any] = {
        "bootstrap_servers": "unused:9092", "group": "g", "topics": ("in",),
        "batch_format": "record", "chunk_size": 2, "max_attempts": 3,
        "retry_on": (TimeoutError,), "output_topic": "out", "dead_letter_topic": "dlq",
        "max_records": None, "time_budget_s": 1.0}
    base.update(kw)
    return WorkerSpec(WorkerConfig(**base), lock_ms=lock_ms, delivery_limit=delivery_limit)


def _session(consumer: FakeConsumer) -> ShareSession:
    return ShareSession(consumer, timeout_s=1.0)


def _run(spec: WorkerSpec, fn: Callable[[Any], Any], polls: list[list[Msg]],
         producer: FakeProducer | None = None) -> tuple[FakeConsumer, FakeProducer,
                                                        dict[str, Any]]:
    consumer = FakeConsumer(polls)
    producer = producer or FakeProducer()
    summary = _Worker(spec, fn, session=_session(consumer), producer=producer).run()
    assert consumer.closed
    return consumer, producer, summary


def test_outcomes_outputs_and_dead_letters() -> None:
    def fn(r: Record) -> Any:
        return {0: Result.accept("o0"), 1: None, 2: Outcome.RELEASE,
                3: Result.reject("bad")}[r.offset]

    c, p, s = _run(_spec(), fn, [[Msg(0), Msg(1), Msg(2), Msg(3)]])
    assert c.acks == {0: "ACCEPT", 1: "ACCEPT", 2: "RELEASE", 3: "REJECT"}
    assert [(t, v) for t, v, _ in p.sent] == [("out", b"o0"), ("dlq", b"v")]
    dead = p.sent[1][2]
    assert dead["h"] == b"1" and dead["kafka-share.error"] == b"bad"
    assert (s["accepted"], s["released"], s["rejected"], s["dead_lettered"]) == (2, 1, 1, 1)


def test_nonsense_results_stop_the_worker_and_release_what_it_holds() -> None:
    # Issue 35: a result no record can carry is the job's mistake, not the records' poison:
    # the worker stops at the first one, RELEASEs every record it holds (the rest of the
    # poll too), writes no dead letter and reports the mistake (it was poison before).
    def fn(r: Record) -> Any:
        return 42 if r.offset == 0 else b"output"

    c, p, s = _run(_spec(output_topic=None), fn, [[Msg(0), Msg(1), Msg(2)], [Msg(3)]])
    assert c.acks == {0: "RELEASE", 1: "RELEASE", 2: "RELEASE"} and p.sent == []
    assert s["failure"]["kind"] == "mistake" and s["failure"]["option"] == "fn"
    assert "returned int" in s["failure"]["message"]
    assert s["stop_reason"] == "configuration mistake (fn)"
    assert (s.get("rejected", 0), s["released"], s["released_on_mistake"]) == (0, 3, 3)


def test_an_output_without_output_topic_names_the_argument() -> None:
    c, p, s = _run(_spec(output_topic=None, chunk_size=1), lambda r: b"output",
                   [[Msg(0), Msg(1)]])
    assert c.acks == {0: "RELEASE", 1: "RELEASE"} and p.sent == []
    assert s["failure"]["option"] == "output_topic"
    assert "pass output_topic=" in s["failure"]["message"]


def test_a_batch_function_returning_the_wrong_count_is_a_mistake() -> None:
    c, p, s = _run(_spec(batch_format="arrow", chunk_size=3), lambda t: [None],
                   [[Msg(0), Msg(1), Msg(2)]])
    assert set(c.acks.values()) == {"RELEASE"} and p.sent == []
    assert "returned 1 results for 3 rows" in s["failure"]["message"]


def test_a_bug_on_every_record_trips_the_breaker_before_any_is_rejected() -> None:
    # Issue 35: the chunk that trips the worker's breaker is judged before it is settled:
    # its failed records are RELEASEd (with or without a dead-letter topic, none is
    # written), the rest of the poll too; the worker stops and names the cause.
    def fn(r: Record) -> None:
        raise KeyError("no such field")

    for dlq in ("dlq", None):
        spec = _spec(chunk_size=30, dead_letter_topic=dlq, time_budget_s=5.0)
        c, p, s = _run(spec, fn, [[Msg(i) for i in range(60)], [Msg(60)]])
        assert set(c.acks.values()) == {"RELEASE"} and len(c.acks) == 60 and p.sent == []
        assert (s.get("rejected", 0), s.get("dead_lettered", 0), s["released_by_breaker"]) \
            == (0, 0, 30)
        assert s["stop_reason"] == "circuit breaker" and s["failures"] == {"KeyError": 30}
        assert "30 of the last 30 records failed with KeyError" in s["failure"]["message"]


def test_the_breaker_keeps_last_deliveries_as_they_were_decided() -> None:
    # A RELEASE on a record's last delivery would archive it: it keeps its REJECT (and
    # its dead letter); ACCEPTed records of the tripping chunk are settled as decided.
    def fn(r: Record) -> Any:
        if r.offset % 3 == 0:
            return None
        raise KeyError("bug")

    polls = [[Msg(i, dc=5 if i == 1 else 1) for i in range(30)]]
    c, p, s = _run(_spec(chunk_size=30), fn, polls)
    assert c.acks[0] == "ACCEPT" and c.acks[1] == "REJECT" and c.acks[2] == "RELEASE"
    assert [t for t, _, _ in p.sent] == ["dlq"] and s["released_by_breaker"] == 19


def test_the_breaker_turned_off_rejects_as_before() -> None:
    def fn(r: Record) -> None:
        raise KeyError("no such field")

    c, p, s = _run(_spec(chunk_size=30, circuit_breaker=None), fn,
                   [[Msg(i) for i in range(30)]])
    assert set(c.acks.values()) == {"REJECT"} and len(p.sent) == 30
    assert s["failure"] is None and s["failures"] == {"KeyError": 30}


def test_refused_output_is_retried_then_dead_lettered_on_the_last_attempt() -> None:
    producer = FakeProducer(refuse=lambda topic, v: topic == "out")
    c, p, s = _run(_spec(), lambda r: b"x", [[Msg(0, dc=1)], [Msg(1, dc=3)]], producer)
    assert c.acks == {0: "RELEASE", 1: "REJECT"}
    assert [t for t, _, _ in p.sent] == ["dlq"]
    assert p.sent[0][2]["kafka-share.error"].startswith(b"gave up after 3 attempts: output")
    assert s["produce_failures"] == 2


def test_an_output_refused_by_a_broker_fault_spends_no_attempt() -> None:
    """A refusal that is not the record's own (a timeout while a leader or coordinator moves)
    RELEASEs the record past ``max_attempts`` (3): deliveries spent on broker faults do not
    make it poison. Only on the broker's last delivery (5) is it dead-lettered, where a
    RELEASE would archive it."""
    from confluent_kafka import KafkaError

    producer = FakeProducer(refuse=lambda topic, v: topic == "out",
                            error=KafkaError(KafkaError._MSG_TIMED_OUT))
    c, p, s = _run(_spec(), lambda r: b"x", [[Msg(0, dc=3)], [Msg(1, dc=5)]], producer)
    assert c.acks == {0: "RELEASE", 1: "REJECT"}
    assert p.sent[0][2]["kafka-share.error"].startswith(b"gave up after 5 attempts: output")
    assert s["exhausted"] == 1


class _SyncRefusing(FakeProducer):
    """Raises ``KafkaException(error)`` in ``produce`` for outputs, as confluent-kafka does for
    a record larger than the producer's ``message.max.bytes``."""

    def __init__(self, error: Any) -> None:
        super().__init__()
        self.sync_error = error

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                headers: Any = None, on_delivery: Any = None) -> None:
        from confluent_kafka import KafkaException

        if topic == "out":
            raise KafkaException(self.sync_error)
        super().produce(topic, value, key, headers, on_delivery)


def test_an_output_too_large_for_the_producer_is_the_records_fault_not_the_workers() -> None:
    """confluent-kafka refuses an output over ``message.max.bytes`` in ``produce()`` itself: a
    retry, then a dead letter on the last attempt, as a refusal by the broker; the worker
    goes on. An error there that is not the record's (a fenced producer) still fails it."""
    from confluent_kafka import KafkaError, KafkaException

    producer = _SyncRefusing(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    c, p, s = _run(_spec(), lambda r: b"x", [[Msg(0, dc=1)], [Msg(1, dc=3)]], producer)
    assert c.acks == {0: "RELEASE", 1: "REJECT"} and s["failure"] is None
    assert p.sent[0][2]["kafka-share.error"].startswith(b"gave up after 3 attempts: output")
    with pytest.raises(KafkaException):
        _run(_spec(), lambda r: b"x", [[Msg(0)]], _SyncRefusing(KafkaError(KafkaError._FENCED)))


def test_a_refusal_is_the_records_own_only_for_its_size_or_bytes() -> None:
    import pickle

    from confluent_kafka import KafkaError

    from pyspark_kafka_share._kafka.produce import refusal

    own = refusal(KafkaError(KafkaError.INVALID_RECORD))
    assert not refusal(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)).transient and not own.transient
    for name in ("_MSG_TIMED_OUT", "NOT_LEADER_FOR_PARTITION", "_PURGE_QUEUE",
                 "INVALID_PRODUCER_EPOCH", "_TRANSPORT"):
        err = refusal(KafkaError(getattr(KafkaError, name)))
        assert err.transient and err == str(KafkaError(getattr(KafkaError, name))), name
    again = pickle.loads(pickle.dumps(own))
    assert again == own and not again.transient


def test_refused_dead_letter_releases_below_the_delivery_limit() -> None:
    producer = FakeProducer(refuse=lambda topic, v: topic == "dlq")
    c, _, _ = _run(_spec(), lambda r: Outcome.REJECT, [[Msg(0, dc=2)]], producer)
    assert c.acks == {0: "RELEASE"}  # not REJECTed without its dead letter


def test_refused_dead_letter_on_the_last_delivery_fails_the_worker() -> None:
    producer = FakeProducer(refuse=lambda topic, v: topic == "dlq")
    spec = _spec(lock_ms=2_000)  # deadline: 1 s after the poll
    start = time.monotonic()
    with pytest.raises(BrokerError, match="did not take record in-0@0 on its last delivery"):
        _run(spec, lambda r: Outcome.REJECT, [[Msg(0, dc=5)]], producer)
    assert time.monotonic() - start >= 0.4  # kept trying until the lock deadline


def test_repeated_produce_failures_fail_the_worker() -> None:
    producer = FakeProducer(refuse=lambda topic, v: True)
    polls = [[Msg(i, dc=1)] for i in range(5)]
    with pytest.raises(BrokerError, match="failed in 3 chunks in a row"):
        _run(_spec(), lambda r: b"x", polls, producer)


def test_a_stop_releases_the_rest_of_the_poll_but_not_last_deliveries() -> None:
    def fn(r: Record) -> None:
        time.sleep(0.4)

    spec = _spec(time_budget_s=0.2, chunk_size=1)
    c, _, s = _run(spec, fn, [[Msg(0), Msg(1), Msg(2, dc=5), Msg(3)]])
    # Offset 0 was processed before the budget ran out; 2 is on its last delivery.
    assert c.acks == {0: "ACCEPT", 1: "RELEASE", 2: "ACCEPT", 3: "RELEASE"}
    assert s["released_on_stop"] == 2 and s["stop_reason"] == "time budget"


def test_the_lock_deadline_releases_what_would_not_finish_in_time() -> None:
    def fn(r: Record) -> None:
        time.sleep(0.3)

    spec = _spec(lock_ms=2_000, chunk_size=1, time_budget_s=3.0)  # deadline 1 s - 0.5 s margin
    c, _, s = _run(spec, fn, [[Msg(i) for i in range(6)]])
    assert s["released_lock_deadline"] > 0
    assert set(c.acks) == set(range(6))
    assert list(c.acks.values()).count("ACCEPT") < 6


class _SlowFirstFlush(FakeProducer):
    """The first flush takes 1.5 s (a transaction coordinator's failover), the others none."""

    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self, timeout: float) -> int:
        self.flushes += 1
        if self.flushes == 1:
            time.sleep(1.5)
        return super().flush(timeout)


def test_one_slow_settling_does_not_release_every_later_chunk() -> None:
    # A settling that took 1.5 s makes a chunk of a poll with 1 s left wait for the next
    # delivery; not every later one (the average, refreshed only by settling, stayed put:
    # each poll released unprocessed until the records' last delivery).
    spec = _spec(lock_ms=2_000, chunk_size=1, time_budget_s=2.5)  # deadline 1 s after a poll
    c, _, s = _run(spec, lambda r: b"x", [[Msg(0)], [Msg(1)], [Msg(2)], [Msg(3)]],
                   _SlowFirstFlush())
    assert c.acks == {0: "ACCEPT", 1: "RELEASE", 2: "ACCEPT", 3: "ACCEPT"}
    assert s["released_lock_deadline"] == 1


def test_an_exception_mid_poll_releases_every_unacknowledged_record() -> None:
    def fn(r: Record) -> None:
        if r.offset == 2:
            raise KeyboardInterrupt

    consumer = FakeConsumer([[Msg(0), Msg(1), Msg(2), Msg(3)]])
    with pytest.raises(KeyboardInterrupt):
        _Worker(_spec(), fn, session=_session(consumer), producer=FakeProducer()).run()
    assert consumer.acks == {0: "ACCEPT", 1: "ACCEPT", 2: "RELEASE", 3: "RELEASE"}
    assert consumer.closed


class _Outage:
    """A ``BrokerWatch`` whose brokers are down for the first ``polls`` polls."""

    def __init__(self, polls: int) -> None:
        self.left, self.ended_at = polls, 0.0

    @property
    def down(self) -> bool:
        return self.left > 0

    def observe(self, errors: Any, got_records: bool) -> None:
        if self.left > 0:
            self.left -= 1
            if self.left == 0:
                self.ended_at = time.monotonic()


def test_an_outage_is_not_idleness() -> None:
    """The driver stops idle workers by the ``idle_s`` they report (idle_timeout_s): it must
    not count a broker outage, nor the time before it ended (a restart left records queued)."""
    worker = _Worker(_spec(), lambda r: None, session=_session(FakeConsumer([])),
                     producer=FakeProducer())
    outage = _Outage(polls=3)
    worker.brokers = outage  # type: ignore[assignment]
    reports: list[float] = []

    def should_stop() -> bool:  # five polls, each report's idle_s kept
        reports.append(worker.report()["idle_s"])
        return len(reports) > 5

    worker.should_stop = should_stop  # type: ignore[method-assign]
    worker.last_active -= 100.0  # idle long before the outage
    worker.run()
    assert reports[:3] == [0.0, 0.0, 0.0]  # while down (before polls 1-3)
    assert worker.last_active >= outage.ended_at > 0  # idle again from the outage's end
    assert reports[-1] < 50.0
