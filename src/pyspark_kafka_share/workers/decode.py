"""Decoding a record's key and value before the function sees them (``key_deserializer`` /
``value_deserializer``).

A deserializer is a plain callable of the bytes (``json.loads``, a protobuf message's
``FromString``), or one of confluent-kafka's deserializers (``confluent_kafka.serialization``:
``StringDeserializer``, ..., and the Schema Registry's ``AvroDeserializer``,
``ProtobufDeserializer``, ``JSONDeserializer``), called with the record's
``SerializationContext`` (topic, field, headers) as confluent-kafka's consumers call them.
A Schema Registry deserializer holds a registry client that cannot be sent to the executors:
:class:`SchemaRegistryDeserializer` names it by kind and client settings instead and builds
it once per worker process.

:func:`decode` returns the decoded pair or raises :class:`DecodeError`. What fails to decode is
the record's poison (dead-lettered with the decoder's error, REJECTed), except a registry that
cannot be reached or answers 5xx/429 (:func:`transient`): that is a retry. A deserializer that
fails on every record is the circuit breaker's business (``breaker.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark_kafka_share.errors import OptionError

__all__ = ["DecodeError", "Deserializer", "SchemaRegistryDeserializer", "check_deserializer",
           "decode", "transient"]

Deserializer = Callable[..., Any]
"""A callable of the bytes, or a confluent-kafka ``Deserializer`` (bytes, context)."""

_KINDS = {
    "avro": ("confluent_kafka.schema_registry.avro", "AvroDeserializer"),
    "protobuf": ("confluent_kafka.schema_registry.protobuf", "ProtobufDeserializer"),
    "json": ("confluent_kafka.schema_registry.json_schema", "JSONDeserializer"),
}
# Per process (each worker's Python process builds its own): registry clients by settings,
# deserializers by description.
_CLIENTS: dict[str, Any] = {}
_BUILT: dict[tuple[str, str], Any] = {}
_CACHE_LOCK = threading.Lock()


class DecodeError(Exception):
    """A key or value that its deserializer could not decode (``field``: key or value)."""

    def __init__(self, field_name: str, cause: Exception) -> None:
        self.field = field_name
        self.cause = cause
        super().__init__(f"{field_name}_deserializer: {type(cause).__name__}: {cause}")


@dataclass(frozen=True)
class SchemaRegistryDeserializer:
    """A Schema Registry deserializer by description (picklable), built on first use in each
    worker process: ``kind`` is ``avro``, ``protobuf`` or ``json``; ``registry`` the
    ``SchemaRegistryClient`` settings (``{"url": ...}``, auth); ``schema_str`` (Avro, JSON
    Schema: the reader's schema; default the writer's), ``message_type`` (Protobuf: the
    generated message class, required), ``conf`` the deserializer's own settings.
    Needs ``pip install 'pyspark-kafka-share[schema-registry]'``."""

    kind: str
    registry: Mapping[str, Any] = field(hash=False, repr=False)  # may hold credentials
    schema_str: str | None = None
    message_type: Any = None
    conf: Mapping[str, Any] | None = field(default=None, hash=False, repr=False)

    def registry_client(self) -> Any:
        """This process's ``SchemaRegistryClient`` of :attr:`registry` (one per settings)."""
        from confluent_kafka.schema_registry import SchemaRegistryClient

        key = repr(sorted(dict(self.registry).items()))
        with _CACHE_LOCK:
            client = _CLIENTS.get(key)
            if client is None:
                client = _CLIENTS[key] = SchemaRegistryClient.new_client(dict(self.registry))
        return client

    def build(self) -> Any:
        """The confluent-kafka deserializer this describes (on this process's client)."""
        import importlib

        module, name = _KINDS[self.kind]
        cls = getattr(importlib.import_module(module), name)
        conf = dict(self.conf or {})
        if self.kind == "protobuf":
            return cls(self.message_type, conf,
                       schema_registry_client=self.registry_client())
        if self.kind == "json":
            return cls(self.schema_str, schema_registry_client=self.registry_client(),
                       conf=conf)
        return cls(self.registry_client(), self.schema_str, conf=conf)

    def __call__(self, data: bytes | None, ctx: Any) -> Any:
        key = (repr(self), repr(sorted(dict(self.registry).items())) +
               repr(sorted(dict(self.conf or {}).items())))
        built = _BUILT.get(key)
        if built is None:
            built = self.build()
            with _CACHE_LOCK:
                built = _BUILT.setdefault(key, built)
        return built(data, ctx)


def check_deserializer(name: str, value: object, batch_format: str) -> None:
    """The options ``key_deserializer`` / ``value_deserializer``."""
    if value is None:
        return
    if not callable(value):
        raise OptionError(name, type(value).__name__, "give a callable of the bytes (e.g. "
                          "json.loads), a confluent-kafka Deserializer, or a "
                          "SchemaRegistryDeserializer")
    if batch_format != "record":
        raise OptionError(name, type(value).__name__, "decodes records for "
                          "batch_format='record' only; decode the batch's key/value columns "
                          "in the batch function")
    if isinstance(value, SchemaRegistryDeserializer):
        if value.kind not in _KINDS:
            raise OptionError(name, value.kind, f"kind must be one of {', '.join(_KINDS)}")
        if value.kind == "protobuf" and value.message_type is None:
            raise OptionError(name, value, "a protobuf deserializer needs message_type (the "
                              "generated message class)")
        try:
            import confluent_kafka.schema_registry  # noqa: F401
        except ImportError as exc:
            raise OptionError(name, value.kind, "needs confluent-kafka's Schema Registry "
                              "extras: pip install 'pyspark-kafka-share[schema-registry]' "
                              f"({exc})") from None


def _is_confluent(d: Deserializer) -> bool:
    from confluent_kafka.serialization import Deserializer as Confluent

    return isinstance(d, Confluent | SchemaRegistryDeserializer)


def _one(d: Deserializer | None, data: bytes | None, m: Any, which: str) -> Any:
    if d is None:
        return None
    try:
        if _is_confluent(d):
            from confluent_kafka.serialization import MessageField, SerializationContext

            ctx = SerializationContext(m.topic(), MessageField.KEY if which == "key"
                                       else MessageField.VALUE, m.headers())
            return d(data, ctx)
        return d(data)
    except Exception as exc:  # any failure of the decoder is the record's
        raise DecodeError(which, exc) from exc


def decode(m: Any, key_d: Deserializer | None,
           value_d: Deserializer | None) -> tuple[Any, Any]:
    """The decoded key and value of message ``m`` (None where no deserializer is set)."""
    return _one(key_d, m.key(), m, "key"), _one(value_d, m.value(), m, "value")


def transient(exc: DecodeError) -> bool:
    """A failure of the registry rather than of the record: the registry unreachable (an HTTP
    transport error) or answering 5xx / 408 / 429. Such a record is retried, not poison."""
    cause = exc.cause
    status = getattr(cause, "http_status_code", None)
    if isinstance(status, int):
        return status >= 500 or status in (408, 429)
    chain: BaseException | None = cause
    while chain is not None:
        if type(chain).__module__.split(".")[0] in ("httpx", "httpx2", "httpcore", "httpcore2"):
            return True
        chain = chain.__cause__ or chain.__context__
    return False
