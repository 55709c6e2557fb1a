"""The native share consumer (``_kafka/native/``) against a real broker: record batches of
every codec from librdkafka and from the Java producer, ACCEPT/RELEASE/REJECT by redelivery,
RENEW past the lock, ``record_limit`` strictness, two consumers on one partition, close()
releasing, wakeup, an idle consumer acquiring nothing, a broker restart mid-run, SASL_SSL
and mutual TLS."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from pyspark_kafka_share._kafka.connection import ConnectionConfig
from pyspark_kafka_share._kafka.native import (
    NativeConsumerConfig,
    NativeShareConsumer,
    ShareRecord,
)
from pyspark_kafka_share._kafka.protocol.client import KafkaProtocolClient
from pyspark_kafka_share.errors import WakeupError
from pyspark_kafka_share.harness import LocalKafka
from tests.fixtures.kafka import TopicFactory

pytestmark = pytest.mark.broker

CODECS = ["gzip", "snappy", "lz4", "zstd"]
Factory = Callable[..., NativeShareConsumer]


@pytest.fixture
def native(kafka: LocalKafka) -> Iterator[Factory]:
    made: list[NativeShareConsumer] = []

    def make(group: str, topic: str, *, connection: ConnectionConfig | None = None,
             bootstrap: str | None = None, **settings: object) -> NativeShareConsumer:
        config = NativeConsumerConfig(bootstrap or kafka.bootstrap_servers, group,
                                      connection=connection, **settings)  # type: ignore[arg-type]
        consumer = NativeShareConsumer(config, [topic])
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        consumer.close()


def _drain(consumer: NativeShareConsumer, want: int, *, ack: str | None = "ACCEPT",
           within_s: float = 60.0) -> list[ShareRecord]:
    """Poll until ``want`` records came (acknowledging each as ``ack``), or the time is up."""
    got: list[ShareRecord] = []
    deadline = time.monotonic() + within_s
    while len(got) < want and time.monotonic() < deadline:
        for record in consumer.poll(1.0):
            got.append(record)
            if ack is not None:
                consumer.acknowledge(record, ack)
    return got


def _values(n: int, tag: str = "v") -> list[bytes]:
    return [f"{tag}-{i:05d}".encode() for i in range(n)]


# -- codecs --------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_librdkafka_batches_of_each_codec(kafka: LocalKafka, topic: str, group: str,
                                          native: Factory, codec: str) -> None:
    values = _values(500)
    kafka.produce(topic, values, producer_config={"compression.type": codec,
                                                  "linger.ms": "50"})
    consumer = native(group, topic, max_poll_records=1000)
    got = _drain(consumer, len(values))
    assert [r.value for r in sorted(got, key=lambda r: r.offset)] == values
    assert set(consumer.batch_codecs) == {codec}
    assert consumer.commit_sync() == {(topic, 0): 0}


@pytest.mark.parametrize("codec", CODECS)
def test_java_producer_batches_of_each_codec(kafka: LocalKafka, topic: str, group: str,
                                             native: Factory, codec: str) -> None:
    kafka.run_tool("ProducerPerformance", "--topic", topic, "--num-records", "1000",
                   "--record-size", "200", "--throughput", "-1", "--producer-props",
                   f"bootstrap.servers={kafka.bootstrap_servers}", f"compression.type={codec}",
                   "linger.ms=20")
    consumer = native(group, topic, max_poll_records=1000)
    got = _drain(consumer, 1000)
    assert sorted(r.offset for r in got) == list(range(1000))
    assert all(r.value is not None and len(r.value) == 200 for r in got)
    assert set(consumer.batch_codecs) == {codec}


# -- acknowledgement semantics -------------------------------------------------------------


def test_accept_release_reject_by_redelivery(kafka: LocalKafka, topic: str, group: str,
                                             native: Factory) -> None:
    kafka.produce(topic, [b"accept", b"release", b"reject"])
    consumer = native(group, topic)
    first = _drain(consumer, 3, ack=None)
    assert [(r.value, r.delivery_count) for r in first] == \
        [(b"accept", 1), (b"release", 1), (b"reject", 1)]
    for record in first:
        consumer.acknowledge(record, record.value.decode().upper())  # type: ignore[union-attr]
    assert consumer.commit_sync() == {(topic, 0): 0}
    again = _drain(consumer, 1, ack="ACCEPT")
    assert [(r.value, r.delivery_count) for r in again] == [(b"release", 2)]
    assert consumer.poll(3.0) == []  # the accepted and the rejected one never come back


def test_renew_keeps_a_record_past_its_lock(kafka: LocalKafka, topic: str, group: str,
                                            native: Factory) -> None:
    lock_ms = 2_000
    kafka.set_group_config(group, "share.record.lock.duration.ms", lock_ms)
    # KIP-1240: from 4.3 on, RENEW is off per group unless enabled
    if tuple(int(x) for x in kafka.version.split(".")[:2]) >= (4, 3):
        kafka.set_group_config(group, "share.renew.acknowledge.enable", "true")
    kafka.produce(topic, [b"long work"])
    holder, other = native(group, topic), native(group, topic)
    (record,) = _drain(holder, 1, ack=None)
    first_deadline = record.deadline
    assert first_deadline - time.monotonic() <= lock_ms / 1000.0
    end = time.monotonic() + 4 * lock_ms / 1000.0  # twice the lock, twice over
    while time.monotonic() < end:
        holder.acknowledge(record, "RENEW")
        assert holder.commit_sync() == {(topic, 0): 0}
        (record,) = holder.held()
        assert other.poll(lock_ms / 3000.0) == []  # never redelivered to anyone
    assert record.deadline > first_deadline + lock_ms / 1000.0
    assert record.delivery_count == 1
    holder.acknowledge(record, "ACCEPT")
    assert holder.commit_sync() == {(topic, 0): 0}
    assert other.poll(lock_ms / 500.0) == []


def test_record_limit_is_strict_with_batches_of_1000(kafka: LocalKafka, topic_factory: TopicFactory,
                                                     group: str, native: Factory) -> None:
    strict_topic, soft_topic = topic_factory(1), topic_factory(1)
    one_batch = {"linger.ms": "1000", "batch.num.messages": "1000", "batch.size": "1000000"}
    for t in (strict_topic, soft_topic):
        kafka.produce(t, _values(1000), producer_config=one_batch)
    strict = native(group, strict_topic, max_poll_records=7, record_limit=True)
    sizes = []
    got: list[ShareRecord] = []
    deadline = time.monotonic() + 120
    while len(got) < 1000 and time.monotonic() < deadline:
        records = strict.poll(1.0)
        sizes.append(len(records))
        for r in records:
            strict.acknowledge(r)
        got += records
    assert sorted(r.offset for r in got) == list(range(1000))
    assert max(sizes) <= 7
    soft = native(group + "-soft", soft_topic, max_poll_records=7)
    kafka.set_group_config(group + "-soft", "share.auto.offset.reset", "earliest")
    assert len(_drain(soft, 8, ack=None)) > 7  # without it, whole producer batches come


def test_two_consumers_split_one_partition(kafka: LocalKafka, topic: str, group: str,
                                           native: Factory) -> None:
    kafka.produce(topic, _values(1000), producer_config={"linger.ms": "100"})
    a = native(group, topic, max_poll_records=50, record_limit=True)
    b = native(group, topic, max_poll_records=50, record_limit=True)
    got: dict[str, list[int]] = {"a": [], "b": []}
    deadline = time.monotonic() + 120
    while len(got["a"]) + len(got["b"]) < 1000 and time.monotonic() < deadline:
        for name, consumer in (("a", a), ("b", b)):
            for r in consumer.poll(0.5):
                consumer.acknowledge(r)
                got[name].append(r.offset)
    assert sorted(got["a"] + got["b"]) == list(range(1000))  # none twice, none lost
    assert got["a"] and got["b"]


def test_close_releases_what_it_holds(kafka: LocalKafka, topic: str, group: str,
                                      native: Factory) -> None:
    kafka.produce(topic, _values(20))
    first = native(group, topic)
    held = _drain(first, 20, ack=None)
    assert len(held) == 20
    first.close()
    with KafkaProtocolClient(kafka.bootstrap_servers) as admin:  # it left the group
        members = admin.describe_share_group(group).members
    assert first.member_id not in {m.member_id for m in members}
    second = native(group, topic)
    start = time.monotonic()
    again = _drain(second, 20)
    assert sorted(r.offset for r in again) == sorted(r.offset for r in held)
    assert {r.delivery_count for r in again} == {2}
    assert time.monotonic() - start < 20  # released, not waiting out the 30 s lock


def test_an_idle_consumer_acquires_nothing(kafka: LocalKafka, topic: str, group: str,
                                           native: Factory) -> None:
    idle = native(group, topic)
    assert idle.poll(5.0) == []  # joins (the topic is empty yet), then never polls again
    kafka.produce(topic, _values(10))
    busy = native(group, topic)
    got = _drain(busy, 10)
    assert sorted(r.offset for r in got) == list(range(10))
    assert {r.delivery_count for r in got} == {1}


def test_wakeup_interrupts_poll_from_another_thread(topic: str, group: str,
                                                    native: Factory) -> None:
    consumer = native(group, topic)
    timer = threading.Timer(1.0, consumer.wakeup)
    timer.start()
    start = time.monotonic()
    with pytest.raises(WakeupError):
        consumer.poll(30.0)
    assert time.monotonic() - start < 5.0
    assert consumer.poll(0.5) == []  # still usable


def test_a_broker_restart_mid_run_loses_nothing() -> None:
    with LocalKafka(heap="512m") as broker:
        name, group = broker.create_topic("native-restart", 1), "native-restart-group"
        broker.set_group_config(group, "share.auto.offset.reset", "earliest")
        broker.produce(name, _values(200))
        config = NativeConsumerConfig(broker.bootstrap_servers, group, max_poll_records=50,
                                      record_limit=True)
        with NativeShareConsumer(config, [name]) as consumer:
            before = _drain(consumer, 100)
            assert consumer.commit_sync() == {(name, 0): 0}  # settled before the restart
            broker.restart()
            after = _drain(consumer, 200 - len(before), within_s=120)
        accepted = {r.offset for r in before}
        assert accepted.isdisjoint(r.offset for r in after)  # accepted: never again
        assert accepted | {r.offset for r in after} == set(range(200))


# -- security ------------------------------------------------------------------------------


def test_sasl_ssl_and_mutual_tls() -> None:
    user, password = "carol", "carol-pw-Qr4"
    with LocalKafka(security="sasl_ssl,ssl", users={user: password}, heap="512m") as secured:
        name = secured.create_topic("native-secured", 1)
        group = "native-secured-group"
        secured.set_group_config(group, "share.auto.offset.reset", "earliest")
        for resource, rname in (("TOPIC", name), ("GROUP", group)):
            secured.grant(user, resource, rname, "READ")  # the user: SCRAM name and cert CN
        for listener, mechanism in (("sasl_ssl", "SCRAM-SHA-512"), ("ssl", None)):
            secured.produce(name, _values(50, listener))
            config = NativeConsumerConfig(
                secured.secured.bootstrap(listener), group,
                connection=secured.connection_config(user, mechanism=mechanism,
                                                     listener=listener))
            with NativeShareConsumer(config, [name]) as consumer:
                got = _drain(consumer, 50)
                assert {r.value for r in got} == set(_values(50, listener)), listener
                assert consumer.commit_sync() == {(name, 0): 0}
