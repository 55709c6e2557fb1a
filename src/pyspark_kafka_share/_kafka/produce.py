"""Producing with confluent-kafka: one record at a time, riding out a full local queue."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from pyspark_kafka_share.errors import BrokerError, is_record_own

__all__ = ["Refusal", "produce", "refusal"]


class Refusal(str):
    """A record's delivery error, as text; ``transient``: not the record's own
    (:func:`~pyspark_kafka_share.errors.is_record_own`), so the same record may be delivered
    later."""

    transient: bool

    def __new__(cls, text: str, transient: bool) -> Refusal:
        self = super().__new__(cls, text)
        self.transient = transient
        return self

    def __getnewargs__(self) -> tuple[str, bool]:  # type: ignore[override]
        return str(self), self.transient  # pickle and copy


def refusal(err: Any) -> Refusal:
    """The delivery error ``err`` (a ``KafkaError``) as a :class:`Refusal`."""
    return Refusal(str(err), transient=not is_record_own(err))


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
