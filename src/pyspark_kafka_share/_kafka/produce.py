"""Producing with confluent-kafka: one record at a time, riding out a full local queue."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from pyspark_kafka_share.errors import BrokerError

__all__ = ["Refusal", "produce", "refusal"]

# Delivery-report errors (librdkafka's names) that are the record's own, its size or its
# bytes: the same record is refused again. Any other (a timeout, a leader or coordinator
# moving, a purged or aborted transaction, a connection lost, a skewed clock's
# INVALID_TIMESTAMP) is the broker's or the connection's, not the record's.
_RECORD_OWN = frozenset({"MSG_SIZE_TOO_LARGE", "INVALID_MSG_SIZE", "RECORD_LIST_TOO_LARGE",
                         "INVALID_RECORD", "INVALID_MSG"})


class Refusal(str):
    """A record's delivery error, as text; ``transient``: not the record's own (see
    :data:`_RECORD_OWN`), so the same record may be delivered later."""

    transient: bool

    def __new__(cls, text: str, transient: bool) -> Refusal:
        self = super().__new__(cls, text)
        self.transient = transient
        return self

    def __getnewargs__(self) -> tuple[str, bool]:  # type: ignore[override]
        return str(self), self.transient  # pickle and copy


def refusal(err: Any) -> Refusal:
    """The delivery error ``err`` (a ``KafkaError``, or its name) as a :class:`Refusal`."""
    name = err.name() if callable(getattr(err, "name", None)) else str(err)
    return Refusal(str(err), transient=name not in _RECORD_OWN)


def produce(producer: Any, topic: str, value: bytes | str | None, *,
            key: bytes | str | None = None,
            headers: Sequence[tuple[str, bytes | None]] | None = None,
            on_delivery: Callable[[Any, Any], None] | None = None,
            timeout_s: float = 30.0, **extra: Any) -> None:
    """Queue one record; while the producer's local queue is full, serve delivery reports and
    retry, for at most ``timeout_s`` (then :class:`BrokerError`). ``extra``: ``partition``,
    ``timestamp``."""
    give_up = time.monotonic() + timeout_s
    while True:
        try:
            producer.produce(topic, value=value, key=key, headers=headers,
                             on_delivery=on_delivery, **extra)
            return
        except BufferError:
            if time.monotonic() > give_up:
                raise BrokerError(f"the producer's queue to {topic!r} stayed full for "
                                  f"{timeout_s:.0f}s") from None
            producer.poll(0.1)
