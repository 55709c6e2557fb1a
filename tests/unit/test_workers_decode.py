"""Decoding (``key_deserializer`` / ``value_deserializer``, issue 40) and the retry knobs
through one worker's loop, on scripted messages (pure unit tests, no broker). Schema Registry
deserializers run against confluent-kafka's mock registry (``mock://``): a registered schema,
an evolved one, a bad record."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from pyspark_kafka_share._kafka.share import ShareSession
from pyspark_kafka_share.errors import OptionError
from pyspark_kafka_share.workers import Backoff, SchemaRegistryDeserializer
from pyspark_kafka_share.workers.config import WorkerConfig, WorkerSpec
from pyspark_kafka_share.workers.decode import DecodeError, decode, transient
from pyspark_kafka_share.workers.loop import _Worker
from pyspark_kafka_share.workers.outcome import Outcome, Record, Result

from .fakes import FakeConsumer, FakeProducer, Msg


def _needs_registry() -> None:
    """The Schema Registry tests need the extra (``.[dev]`` installs it): skipped, and said
    so, where it is missing."""
    for module in ("confluent_kafka.schema_registry", "fastavro", "jsonschema"):
        pytest.importorskip(module, reason="needs pyspark-kafka-share[schema-registry]")


def _spec(**kw: Any) -> WorkerSpec:
    base: dict[str, Any] = {
        "bootstrap_servers": "unused:9092", "group": "g", "topics": ("in",),
        "chunk_size": 10, "max_attempts": 3, "output_topic": "out",
        "dead_letter_topic": "dlq", "time_budget_s": 1.0}
    base.update(kw)
    return WorkerSpec(WorkerConfig(**base), lock_ms=30_000, delivery_limit=5)


def _run(spec: WorkerSpec, fn: Callable[[Any], Any], polls: list[list[Msg]]) \
        -> tuple[FakeConsumer, FakeProducer, dict[str, Any]]:
    consumer, producer = FakeConsumer(polls), FakeProducer()
    worker = _Worker(spec, fn, session=ShareSession(consumer, timeout_s=1.0), producer=producer)
    return consumer, producer, worker.run()


# ---- plain deserializers ---------------------------------------------------------------------


def test_an_undecodable_record_is_dead_lettered_with_the_decoders_error() -> None:
    seen: list[Any] = []

    def fn(r: Record) -> None:
        seen.append(r.decoded_value)

    polls = [[Msg(0, value=b'{"id": 1}'), Msg(1, value=b"not json"), Msg(2, value=b"[2]")]]
    c, p, s = _run(_spec(value_deserializer=json.loads), fn, polls)
    assert seen == [{"id": 1}, [2]]
    assert c.acks == {0: "ACCEPT", 1: "REJECT", 2: "ACCEPT"}
    ((topic, value, headers),) = p.sent
    assert (topic, value) == ("dlq", b"not json")  # the record as it came, to look at again
    assert headers["kafka-share.error"].startswith(b"value_deserializer: JSONDecodeError: ")
    assert headers["kafka-share.error.type"] == b"JSONDecodeError"
    assert (s["undecodable"], s["rejected"], s["dead_lettered"]) == (1, 1, 1)


def test_keys_decode_too_and_raw_bytes_stay() -> None:
    seen: list[tuple[Any, bytes | None, Any, bytes | None]] = []
    _run(_spec(key_deserializer=bytes.decode, value_deserializer=json.loads),
         lambda r: seen.append((r.decoded_key, r.key, r.decoded_value, r.value)),
         [[Msg(0, value=b"1")]])
    assert seen == [("k0", b"k0", 1, b"1")]


def test_confluent_deserializers_get_the_records_context() -> None:
    from confluent_kafka.serialization import StringDeserializer

    m = Msg(0, value="é".encode())
    assert decode(m, StringDeserializer("utf_8"), StringDeserializer("utf_8")) == ("k0", "é")
    with pytest.raises(DecodeError, match="value_deserializer: SerializationError"):
        decode(Msg(1, value=b"\xff"), None, StringDeserializer("utf_8"))


def test_a_deserializer_on_a_batch_function_is_refused() -> None:
    with pytest.raises(OptionError, match="batch_format='record' only"):
        WorkerConfig.create(topics="in", group="g", bootstrap_servers="b:9092",
                            batch_format="pandas", value_deserializer=json.loads)
    with pytest.raises(OptionError, match="a callable of the bytes"):
        WorkerConfig.create(topics="in", group="g", bootstrap_servers="b:9092",
                            value_deserializer="avro")
    with pytest.raises(OptionError, match="kind must be one of avro, protobuf, json"):
        WorkerConfig.create(topics="in", group="g", bootstrap_servers="b:9092",
                            value_deserializer=SchemaRegistryDeserializer("xml", {}))


def test_a_registry_outage_is_a_retry_not_poison() -> None:
    _needs_registry()
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    def failing(status: int) -> DecodeError:
        return DecodeError("value", SchemaRegistryError(status, status * 100, "registry"))

    assert transient(failing(503)) and transient(failing(429))
    assert not transient(failing(404)) and not transient(DecodeError("value", ValueError()))

    def down(data: bytes | None) -> Any:
        raise SchemaRegistryError(503, 50301, "the registry is down")

    c, p, s = _run(_spec(value_deserializer=down), lambda r: None, [[Msg(0)]])
    assert c.acks == {0: "RELEASE"} and p.sent == [] and s.get("undecodable", 0) == 0


# ---- Schema Registry (confluent-kafka's mock registry) ---------------------------------------

_USER_V1 = json.dumps({"type": "record", "name": "User", "fields": [
    {"name": "name", "type": "string"}]})
_USER_V2 = json.dumps({"type": "record", "name": "User", "fields": [
    {"name": "name", "type": "string"},
    {"name": "tier", "type": "string", "default": "free"}]})


def _registry(url: str) -> tuple[SchemaRegistryDeserializer, Any]:
    _needs_registry()
    d = SchemaRegistryDeserializer("avro", {"url": url})
    return d, d.registry_client()


def test_avro_registered_evolved_and_bad_records() -> None:
    _needs_registry()
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    d, client = _registry("mock://avro-evolution")
    ctx = SerializationContext("users", MessageField.VALUE)
    v1 = AvroSerializer(client, _USER_V1)({"name": "ada"}, ctx)
    v2 = AvroSerializer(client, _USER_V2)({"name": "bob", "tier": "gold"}, ctx)
    assert v1 != v2 and v1[1:5] != v2[1:5]  # two schema versions, two ids in the frames
    polls = [[Msg(0, value=v1), Msg(1, value=v2), Msg(2, value=b"\x00\x00\x00\x00\x63junk"),
              Msg(3, value=b"no magic byte")]]
    seen: dict[int, Any] = {}
    c, p, s = _run(_spec(value_deserializer=d),
                   lambda r: seen.__setitem__(r.offset, r.decoded_value), polls)
    assert seen == {0: {"name": "ada"}, 1: {"name": "bob", "tier": "gold"}}
    assert c.acks == {0: "ACCEPT", 1: "ACCEPT", 2: "REJECT", 3: "REJECT"}
    errors = [h["kafka-share.error"].decode() for _, _, h in p.sent]
    assert all(e.startswith("value_deserializer: ") for e in errors) and len(errors) == 2
    assert "Schema Not Found" in errors[0] and s["undecodable"] == 2


def test_avro_with_a_readers_schema_reads_old_records_as_new() -> None:
    _needs_registry()
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    d, client = _registry("mock://avro-reader")
    ctx = SerializationContext("users", MessageField.VALUE)
    old = AvroSerializer(client, _USER_V1)({"name": "ada"}, ctx)
    reader = SchemaRegistryDeserializer("avro", {"url": "mock://avro-reader"},
                                        schema_str=_USER_V2)
    assert decode(Msg(0, value=old), None, reader)[1] == {"name": "ada", "tier": "free"}
    assert decode(Msg(0, value=old), None, d)[1] == {"name": "ada"}


def test_json_schema_registered_and_a_record_that_breaks_it() -> None:
    _needs_registry()
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}},
                         "required": ["n"]})
    d = SchemaRegistryDeserializer("json", {"url": "mock://json"}, schema_str=schema)
    ctx = SerializationContext("nums", MessageField.VALUE)
    good = JSONSerializer(schema, d.registry_client())({"n": 7}, ctx)
    bad = good[:5] + json.dumps({"n": "seven"}).encode()  # framed, but not valid
    assert decode(Msg(0, value=good), None, d)[1] == {"n": 7}
    with pytest.raises(DecodeError, match="value_deserializer: SerializationError") as err:
        decode(Msg(1, value=bad), None, d)
    assert not transient(err.value)


def _order_class(version: int) -> Any:
    """A generated-like protobuf class ``acme.Order`` (v2 adds a field), built at run time."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # type: ignore[import-untyped]

    field_type = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="acme/order.proto", package="acme",
                                               syntax="proto3")
    message = proto.message_type.add(name="Order")
    message.field.add(name="id", number=1, type=field_type.TYPE_INT64)
    if version == 2:
        message.field.add(name="priority", number=2, type=field_type.TYPE_STRING)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("acme.Order"))


def test_protobuf_registered_evolved_and_bad_records() -> None:
    _needs_registry()
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    v1, v2 = _order_class(1), _order_class(2)
    conf = {"use.deprecated.format": False}
    d = SchemaRegistryDeserializer("protobuf", {"url": "mock://protobuf"}, message_type=v1,
                                   conf=conf)
    ctx = SerializationContext("orders", MessageField.VALUE)
    old = ProtobufSerializer(v1, d.registry_client(), conf)(v1(id=7), ctx)
    new = ProtobufSerializer(v2, d.registry_client(), conf)(v2(id=8, priority="high"), ctx)
    assert decode(Msg(0, value=old), None, d)[1] == v1(id=7)
    assert decode(Msg(1, value=new), None, d)[1].id == 8  # a v1 reader of a v2 record
    with pytest.raises(DecodeError, match=r"value_deserializer: SerializationError.*corrupt"):
        decode(Msg(2, value=new[:6] + b"\xff\xff\xff"), None, d)


def test_a_schema_registry_deserializer_pickles_without_its_client() -> None:
    import pickle

    _needs_registry()
    d = SchemaRegistryDeserializer("avro", {"url": "mock://pickled",
                                            "basic.auth.user.info": "u:secret"})
    d.registry_client()
    again = pickle.loads(pickle.dumps(d))
    assert again == d and "secret" not in repr(d)


# ---- the retry knobs through the loop --------------------------------------------------------


def test_a_service_answering_503_for_a_while_is_waited_out_in_the_worker() -> None:
    calls: dict[int, int] = {}

    def fn(r: Record) -> Result:
        calls[r.offset] = calls.get(r.offset, 0) + 1
        if calls[r.offset] <= 2:
            raise ConnectionError("503 Service Unavailable")
        return Result.accept(b"ok")

    spec = _spec(retry_on=(ConnectionError,),
                 retry_backoff=Backoff(initial_s=0.01, max_s=0.05, jitter=0.5))
    c, p, s = _run(spec, fn, [[Msg(i) for i in range(5)]])
    assert c.acks == dict.fromkeys(range(5), "ACCEPT") and calls == dict.fromkeys(range(5), 3)
    assert [t for t, _, _ in p.sent] == ["out"] * 5  # no dead letter
    assert s["retries"] == 10 and s["retry_wait_ms"] >= 10 and s.get("released", 0) == 0


def test_a_recoverer_that_raises_stops_the_job_and_rejects_nothing() -> None:
    def recoverer(exc: Exception, r: Record) -> Outcome:
        raise AttributeError("typo in the recoverer")

    def fn(r: Record) -> None:
        raise ValueError("bad record")

    c, p, s = _run(_spec(recoverer=recoverer), fn, [[Msg(0), Msg(1)], [Msg(2)]])
    assert c.acks == {0: "RELEASE", 1: "RELEASE"} and p.sent == []
    assert s["failure"]["option"] == "recoverer" and s.get("rejected", 0) == 0
    assert "the recoverer raised AttributeError" in s["failure"]["message"]


def test_the_rate_limit_is_the_workers_share_of_the_job() -> None:
    worker = _Worker(_spec(rate_limit=12.0, workers=3), lambda r: None,
                     session=ShareSession(FakeConsumer([]), timeout_s=1.0),
                     producer=FakeProducer())
    try:
        assert worker.limiter is not None and worker.limiter.rate == 4.0
    finally:
        worker.run()


def test_a_deserializer_holding_its_registry_client_is_refused_at_start() -> None:
    import threading

    from pyspark_kafka_share.workers.preflight import check_callables

    class HoldsAClient:
        """As AvroDeserializer(SchemaRegistryClient(...)): a client with a lock inside."""

        def __init__(self) -> None:
            self.lock = threading.Lock()

        def __call__(self, data: bytes | None) -> Any:
            return data

    config = WorkerConfig.create(topics="in", group="g", bootstrap_servers="b:9092",
                                 value_deserializer=HoldsAClient())
    with pytest.raises(OptionError, match=r"value_deserializer.*SchemaRegistryDeserializer"):
        check_callables(config)
    check_callables(WorkerConfig.create(topics="in", group="g", bootstrap_servers="b:9092",
                                        value_deserializer=json.loads,
                                        recoverer=lambda e, r: Outcome.REJECT))
