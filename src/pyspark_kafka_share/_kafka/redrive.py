"""Redrive: the queue workers' dead letters sent back to the topics they came from.

A worker's dead letter (``workers/settle.py``) is the record as it was delivered (key, value,
its own headers) with headers naming why and where from (:data:`ERROR`, :data:`ERROR_TYPE`,
:data:`ORIGIN_TOPIC`, ...). :func:`read_dead_letters` reads a dead-letter topic with a plain
``assign()``-ed consumer (the journal's replay reader, ``_kafka/replay.py``, under
``read_committed``: the dead letters of an aborted exactly-once transaction are not there),
from given offsets up to the end it had when the read began, and :func:`plan` selects those
whose error matches a pattern and whose time lies in a window; :func:`send` produces them to
their origin topics: key and value as they were, their own headers without the workers'
``kafka-share.*`` ones, plus :data:`REPLAYED_FROM` (where the dead letter was).

Nothing is remembered between runs: a replay run twice sends twice. The run prints each
partition's next offset (:attr:`ReplayPlan.next_offsets`); ``--from-offsets`` starts there.
Records without the origin headers (another producer's, the broker's own KIP-1191 dead
letters) are counted and left alone.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.produce import produce
from pyspark_kafka_share._kafka.replay import read_offsets
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share.errors import BrokerError

__all__ = ["ATTEMPTS", "DLQ_HEADERS", "ERROR", "ERROR_TYPE", "ORIGIN_HEADERS", "ORIGIN_TOPIC",
           "REPLAYED_FROM", "DeadLetter", "ReplayFilter", "ReplayPlan", "dead_letter", "plan",
           "read_dead_letters", "send"]

ERROR = "kafka-share.error"
ERROR_TYPE = "kafka-share.error.type"
ATTEMPTS = "kafka-share.attempts"
ORIGIN_TOPIC = "kafka-share.origin.topic"
ORIGIN_HEADERS = (ORIGIN_TOPIC, "kafka-share.origin.partition", "kafka-share.origin.offset",
                  "kafka-share.origin.group")
"""Where a worker's output or dead letter came from (on both)."""
DLQ_HEADERS = (ERROR, ERROR_TYPE, ATTEMPTS, *ORIGIN_HEADERS)
"""The headers a worker writes on a dead letter, besides the record's own."""
REPLAYED_FROM = "kafka-share.replayed-from"
"""On a replayed record: ``<dead-letter topic>/<partition>/<offset>`` it was sent from."""
_PREFIX = "kafka-share."
_READER_GROUP = "kafka-share-dlq-replay"  # librdkafka wants one; never joined nor committed


@dataclass(frozen=True)
class DeadLetter:
    """One record of a dead-letter topic, as :func:`send` would send it back."""

    partition: int
    offset: int
    timestamp_ms: int | None
    origin_topic: str | None
    """None: not a worker's dead letter (no origin header)."""
    error: str
    error_type: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    """Its own headers, without the workers' ``kafka-share.*`` ones."""


@dataclass(frozen=True)
class ReplayFilter:
    """Which dead letters to send: ``error`` (a regex searched in the error text, or its
    type), ``since_ms``/``until_ms`` (the dead letter's timestamp: when it was written,
    ``since`` included, ``until`` not), ``origin`` (only those from this topic)."""

    error: re.Pattern[str] | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    origin: str | None = None

    def wants(self, d: DeadLetter) -> bool:
        if self.error is not None and not (self.error.search(d.error)
                                           or self.error.search(d.error_type)):
            return False
        if self.origin is not None and d.origin_topic != self.origin:
            return False
        ts = d.timestamp_ms
        if self.since_ms is not None and (ts is None or ts < self.since_ms):
            return False
        return self.until_ms is None or (ts is not None and ts < self.until_ms)


@dataclass
class ReplayPlan:
    """What a replay read and would send."""

    topic: str
    selected: list[DeadLetter] = field(default_factory=list)
    read: int = 0
    foreign: int = 0
    """Records read without the origin headers (left alone)."""
    next_offsets: dict[int, int] = field(default_factory=dict)
    """Per partition, the offset after the last one read (``--from-offsets`` goes on there)."""

    def counts(self) -> list[tuple[str, str, int]]:
        """(origin topic, error type, dead letters) selected, most first."""
        c = Counter((d.origin_topic or "?", d.error_type) for d in self.selected)
        return [(o, e, n) for (o, e), n in c.most_common()]


def _text(headers: Mapping[str, bytes | None], name: str) -> str | None:
    raw = headers.get(name)
    return None if raw is None else raw.decode("utf-8", "replace")


def dead_letter(m: Any) -> DeadLetter:
    """A dead-letter topic's message (confluent-kafka's) as a :class:`DeadLetter`."""
    raw = list(m.headers() or ())
    ours = {k: v for k, v in raw if k.startswith(_PREFIX)}
    ts_type, ts = m.timestamp()
    return DeadLetter(
        m.partition(), m.offset(), ts if ts_type else None, _text(ours, ORIGIN_TOPIC),
        _text(ours, ERROR) or "", _text(ours, ERROR_TYPE) or "", m.key(), m.value(),
        tuple((k, v) for k, v in raw if not k.startswith(_PREFIX)))


def plan(topic: str, messages: Sequence[Any], filt: ReplayFilter,
         next_offsets: Mapping[int, int]) -> ReplayPlan:
    """The dead letters among ``messages`` that ``filt`` selects."""
    out = ReplayPlan(topic, next_offsets=dict(next_offsets))
    for m in messages:
        d = dead_letter(m)
        out.read += 1
        if d.origin_topic is None:
            out.foreign += 1
        elif filt.wants(d):
            out.selected.append(d)
    return out


def read_dead_letters(settings: ClientSettings, topic: str, ends: Mapping[int, int],
                      filt: ReplayFilter, from_offsets: Mapping[int, int] | None = None) \
        -> ReplayPlan:
    """Read ``topic``'s partitions (``ends``: each one's end offset now) from
    ``from_offsets`` (default: their start) to those ends; the plan of what ``filt``
    selects. Raises :class:`BrokerError` for a partition ``from_offsets`` names that the
    topic lacks."""
    starts = dict(from_offsets or {})
    unknown = sorted(set(starts) - set(ends))
    if unknown:
        raise BrokerError(f"{topic!r} has no partition {unknown[0]} (it has "
                          f"{len(ends)}): check --from-offsets")
    wanted = {TopicPartition(topic, p): np.arange(starts.get(p, 0), end, dtype=np.int64)
              for p, end in ends.items()}
    reader = dataclasses.replace(settings, group_id=_READER_GROUP)
    read = read_offsets(reader, wanted, isolation_level="read_committed")
    messages = [m for tp in sorted(read, key=lambda t: t.partition)
                for _, m in sorted(read[tp].records.items())]
    nexts = {p: max(end, starts.get(p, 0)) for p, end in ends.items()}
    return plan(topic, messages, filt, nexts)


def send(settings: ClientSettings, replay: ReplayPlan) -> int:
    """Produce the plan's dead letters to their origin topics (flushed, ``acks=all``); the
    number sent. Raises :class:`BrokerError` naming the first that was not delivered (those
    before it may have been: the run prints what to start from again)."""
    from confluent_kafka import Producer

    if not replay.selected:
        return 0
    producer = Producer(settings.producer())
    errors: list[tuple[DeadLetter, Any]] = []
    for d in replay.selected:
        assert d.origin_topic is not None
        headers = [*d.headers, (REPLAYED_FROM,
                                f"{replay.topic}/{d.partition}/{d.offset}".encode())]

        def report(err: Any, _msg: Any, d: DeadLetter = d) -> None:
            if err is not None:
                errors.append((d, err))

        produce(producer, d.origin_topic, d.value, key=d.key, headers=headers,
                on_delivery=report, timeout_s=settings.timeout_s)
    left = producer.flush(settings.timeout_s + 5)
    if errors or left:
        first = f"{errors[0][0].partition}/{errors[0][0].offset}: {errors[0][1]}" if errors \
            else f"{left} not delivered within {settings.timeout_s + 5:g}s"
        raise BrokerError(f"replaying dead letters of {replay.topic!r}: {len(errors) or left} "
                          f"of {len(replay.selected)} not delivered (first: {first})")
    return len(replay.selected)
