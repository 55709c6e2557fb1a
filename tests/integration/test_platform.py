"""Pin the broker and client behaviour the source relies on, with plain ShareConsumers."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import AcknowledgeType, Message, ShareConsumer

from pyspark_kafka_share.harness import LocalKafka, ProducerRecord
from tests.fixtures.kafka import ShareConsumerFactory
from tests.helpers import poll_share, record_key, record_value


def _poll_until(consumer: ShareConsumer, predicate: Callable[[list[Message]], bool],
                timeout_s: float = 30.0,
                ack: AcknowledgeType = AcknowledgeType.ACCEPT) -> list[Message]:
    """Poll, acknowledge everything with ``ack``, until ``predicate(all_seen)`` holds."""
    return poll_share(consumer, ack, until=predicate, timeout_s=timeout_s, check_commits=True)


def test_two_consumers_split_one_partition(
    kafka: LocalKafka, topic: str, group: str, share_consumer: ShareConsumerFactory
) -> None:
    total = 20_000
    kafka.produce(topic, (b"%d" % i for i in range(total)),
                  producer_config={"batch.size": "2000"})
    a, b = share_consumer(group, [topic]), share_consumer(group, [topic])
    got: dict[str, list[int]] = {"a": [], "b": []}
    deadline = time.monotonic() + 60
    while len(got["a"]) + len(got["b"]) < total and time.monotonic() < deadline:
        for name, consumer in (("a", a), ("b", b)):
            batch = consumer.poll(0.2)
            for msg in batch:
                assert msg.error() is None
                consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
                got[name].append(record_key(msg)[2])
            if len(batch):
                assert all(e is None for e in consumer.commit_sync().values())
    assert got["a"] and got["b"], {k: len(v) for k, v in got.items()}
    both = got["a"] + got["b"]
    assert len(both) == total, "a record was lost or delivered twice"
    assert sorted(both) == list(range(total))


def test_release_redelivers_with_count_two(
    kafka: LocalKafka, topic: str, group: str, share_consumer: ShareConsumerFactory
) -> None:
    kafka.produce(topic, [b"only"])
    consumer = share_consumer(group, [topic])
    first = _poll_until(consumer, lambda s: len(s) >= 1, ack=AcknowledgeType.RELEASE)
    assert [m.delivery_count() for m in first] == [1]
    again = _poll_until(consumer, lambda s: len(s) >= 1)
    assert [(m.offset(), m.delivery_count()) for m in again] == [(first[0].offset(), 2)]


def test_reject_is_not_redelivered(
    kafka: LocalKafka, topic: str, group: str, share_consumer: ShareConsumerFactory
) -> None:
    kafka.produce(topic, [b"poison", b"fine"])
    consumer = share_consumer(group, [topic])
    seen: list[Any] = []
    deadline = time.monotonic() + 30
    while len(seen) < 2 and time.monotonic() < deadline:
        for msg in consumer.poll(0.5):
            kind = AcknowledgeType.REJECT if msg.value() == b"poison" else AcknowledgeType.ACCEPT
            consumer.acknowledge(msg, kind)
            seen.append(msg)
        consumer.commit_sync()
    assert sorted(m.value() for m in seen) == [b"fine", b"poison"]
    kafka.produce(topic, [b"marker"])
    later = _poll_until(consumer, lambda s: any(m.value() == b"marker" for m in s))
    assert [m.value() for m in later] == [b"marker"], "the rejected record came back"


def test_unacknowledged_record_is_redelivered_after_lock_expiry(
    kafka: LocalKafka, topic: str, group: str, share_consumer: ShareConsumerFactory
) -> None:
    kafka.set_group_config(group, "share.record.lock.duration.ms", 2000)
    kafka.produce(topic, [ProducerRecord(value=b"slow", key=b"k")])
    holder = share_consumer(group, [topic])
    deadline = time.monotonic() + 30
    held: list[Any] = []
    while not held and time.monotonic() < deadline:
        held = list(holder.poll(0.5))
    assert [m.delivery_count() for m in held] == [1]
    acquired_at = time.monotonic()
    # The holder never acknowledges; another member gets the record once the lock expires.
    other = share_consumer(group, [topic])
    again = _poll_until(other, lambda s: len(s) >= 1, timeout_s=30)
    waited = time.monotonic() - acquired_at
    assert [(m.value(), m.delivery_count()) for m in again] == [(b"slow", 2)]
    assert waited >= 1.5, f"redelivered after {waited:.1f}s, before the 2 s lock expired"


def test_an_idle_consumer_holds_one_fetch_response_and_closing_spends_a_delivery(
    kafka: LocalKafka, topic: str, group: str, share_consumer: ShareConsumerFactory
) -> None:
    """Why pooled consumers are closed soon after an empty poll (docs/design.md)."""
    idle, other = share_consumer(group, [topic]), share_consumer(group, [topic])
    kafka.produce(topic, [b"warm-up"])
    assert len(_poll_until(idle, lambda s: len(s) >= 1)) == 1
    assert len(idle.poll(0.5)) == 0  # an empty poll: librdkafka keeps a fetch running
    kafka.produce(topic, [b"first-%d" % i for i in range(50)])
    # Nobody polls `idle`; its fetch, parked at the broker since the empty poll, is answered
    # by the broker when the records arrive: it acquires the 50 meanwhile. Nothing outside the
    # client shows the acquisition, so this is a pause; a broker slow to answer would let
    # `other` take records below and fail the check, so it is long against the broker's
    # answer (milliseconds), and `other` then polls 5 s more for anything left.
    time.sleep(3)
    held = _poll_until(other, lambda s: False, timeout_s=5)
    assert held == [], "the idle consumer's fetch should have acquired them"
    kafka.produce(topic, [b"second-%d" % i for i in range(50)])
    assert len(_poll_until(other, lambda s: len(s) >= 50, timeout_s=20)) == 50  # only one fetch
    idle.close()  # releases what it held: one delivery spent
    back = _poll_until(other, lambda s: len(s) >= 50, timeout_s=20)
    assert sorted(record_value(m) for m in back) == sorted(b"first-%d" % i for i in range(50))
    assert {m.delivery_count() for m in back} == {2}


def test_a_consumer_fetches_nothing_while_the_application_works_on_an_acknowledged_poll(
    kafka: LocalKafka, topic: str, group: str, share_consumer: ShareConsumerFactory
) -> None:
    """After a non-empty poll, acknowledged and committed, librdkafka fetches nothing until
    the next poll. The source relies on it (a task waits in ``yield`` while Spark takes its
    rows, and dates the next poll's records from that poll's start), and so do the queue
    workers (user code runs between polls)."""
    busy, other = share_consumer(group, [topic]), share_consumer(group, [topic])
    kafka.produce(topic, [b"warm-up"])
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        got = list(busy.poll(0.5))
    assert [m.value() for m in got] == [b"warm-up"]
    for m in got:
        busy.acknowledge(m, AcknowledgeType.ACCEPT)
    assert all(e is None for e in busy.commit_sync().values())
    kafka.produce(topic, [b"next-%d" % i for i in range(50)])
    # The test's point is that time passes: the application works, `busy` is not polled. A
    # loaded machine only leaves its client less done in the window, which can hide a fetch
    # but cannot fail a correct client.
    time.sleep(3)
    seen = _poll_until(other, lambda s: len(s) >= 50, timeout_s=10)
    assert len(seen) == 50, "busy's client acquired records while the application did not poll"
    assert {m.delivery_count() for m in seen} == {1}
