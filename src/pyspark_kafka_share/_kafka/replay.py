"""Reading given offsets back from Kafka with a plain consumer: the journal's replay path.

An ``offsets`` journal slot holds what a poll acquired, not the records (the log keeps them,
in order, by offset, for the topic's retention). A task that must yield slots it did not poll
itself reads those offsets here: one confluent-kafka ``Consumer`` per call, partitions
``assign()``-ed at the lowest wanted offset (no subscription: no group membership, no
rebalance, no offset commit), every partition of the call at once (librdkafka fetches from
every leader in parallel), each partition's range read once, whatever the number of slots it
serves. Its settings are the source's connection settings (:meth:`ClientSettings.replay_consumer`)
and the share group's ``share.isolation.level``, so it sees exactly the records the share
consumer could have been handed: under ``read_committed`` neither sees aborted records.

What is not there any more is reported, never guessed: offsets below the partition's log start
(retention, ``deleteRecords``), at or past its end (a re-created, shorter topic), or skipped
inside the range (compaction, or records of a re-created topic that the share group never
saw). The caller decides whether that fails the query.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from pyspark_kafka_share._kafka.access import authorization_error
from pyspark_kafka_share._kafka.clientconf import client_config_error
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share.errors import (
    BrokerError,
    ErrorCode,
    denied_resource,
    is_out_of_range,
    is_partition_eof,
    is_unknown_topic,
)

__all__ = ["PartitionRead", "read_offsets"]

_BATCH = 10_000  # messages per consume() call


@dataclass
class PartitionRead:
    """What was read of one partition: the wanted records by offset, the wanted offsets that
    are not in the log, the log's start and end offsets when the read began, and whether the
    partition exists at all."""

    records: dict[int, Any] = field(default_factory=dict)
    missing: npt.NDArray[np.int64] = field(default_factory=lambda: np.empty(0, np.int64))
    low: int = -1
    high: int = -1
    gone: bool = False  # the topic or partition does not exist (deleted)


@dataclass(eq=False)
class _Partition:
    tp: TopicPartition
    wanted: npt.NDArray[np.int64]  # sorted, unique
    read: PartitionRead
    wanted_set: set[int] = field(default_factory=set)
    done: bool = False

    @property
    def last(self) -> int:
        return int(self.wanted[-1])

    def finish(self) -> None:
        self.done = True
        got = np.fromiter(self.read.records, dtype=np.int64, count=len(self.read.records))
        self.read.missing = np.setdiff1d(self.wanted, got, assume_unique=True)


def read_offsets(settings: ClientSettings, wanted: Mapping[TopicPartition, npt.NDArray[np.int64]],
                 *, isolation_level: str, stall_s: float | None = None) \
        -> dict[TopicPartition, PartitionRead]:
    """The records at ``wanted`` offsets (sorted, unique, per partition), read once per
    partition from its lowest to its highest wanted offset.

    Raises :class:`BrokerError` when no record arrives for ``stall_s`` (default: the settings'
    broker timeout) while a partition is unfinished, and an ``AuthorizationError`` naming the
    ACL (READ on the topic) when the broker refuses.
    """
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as CTopicPartition

    stall = settings.timeout_s if stall_s is None else stall_s
    parts = {tp: _Partition(tp, offs, PartitionRead(), set(offs.tolist()))
             for tp, offs in wanted.items() if len(offs)}
    if not parts:
        return {}
    errors: list[Any] = []
    conf = settings.replay_consumer(isolation_level=isolation_level)
    try:
        consumer = Consumer({**conf, "error_cb": errors.append})
    except Exception as exc:  # noqa: BLE001 - librdkafka refused a setting: name it
        raise client_config_error(exc, conf, settings.names.of, settings.names.settings) \
            from None
    try:
        assign = []
        for p in parts.values():
            start = _bounds(consumer, p, settings, stall)
            if start is None:
                p.finish()
            else:
                assign.append(CTopicPartition(p.tp.topic, p.tp.partition, start))
        if assign:
            consumer.assign(assign)
        _consume(consumer, parts, settings, errors, stall)
    finally:
        consumer.close()
    return {tp: p.read for tp, p in parts.items()}


def _consume(consumer: Any, parts: dict[TopicPartition, _Partition], settings: ClientSettings,
             errors: list[Any], stall: float) -> None:
    """Consume until every partition reached its last wanted offset or its end."""
    from confluent_kafka import TopicPartition as CTopicPartition

    last_progress = time.monotonic()
    while not all(p.done for p in parts.values()):
        for m in consumer.consume(num_messages=_BATCH, timeout=0.2):
            err = m.error()
            p = parts.get(TopicPartition(m.topic(), m.partition())) \
                if m.topic() is not None else None
            last_progress = time.monotonic()
            if err is not None:
                _on_error(consumer, err, p, settings, stall)
            elif p is not None and not p.done:
                off = m.offset()
                if off in p.wanted_set:
                    p.read.records[off] = m
                if off >= p.last:
                    p.finish()
                    consumer.pause([CTopicPartition(p.tp.topic, p.tp.partition)])
        _raise_denied(errors, settings)
        if time.monotonic() - last_progress > stall:
            open_parts = [p.tp.key() for p in parts.values() if not p.done]
            why = f"; the client last reported {errors[-1].name()}: {errors[-1].str()}" \
                if errors else ""
            raise BrokerError(
                f"replaying journaled offsets from Kafka: no record of {open_parts} for "
                f"{stall:.0f}s{why}. Check that the brokers are up; the replay reads with "
                "the source's kafka.* connection settings")


def _bounds(consumer: Any, p: _Partition, settings: ClientSettings, timeout_s: float) \
        -> int | None:
    """Read the partition's log start and end; mark what lies outside as missing; the offset
    to start reading at, or None when nothing wanted is left in the log."""
    from confluent_kafka import TopicPartition as CTopicPartition

    try:
        low, high = consumer.get_watermark_offsets(
            CTopicPartition(p.tp.topic, p.tp.partition), timeout=timeout_s, cached=False)
    except Exception as exc:
        if _topic_denied(exc) or _topic_denied(_topic_error(consumer, p.tp.topic, timeout_s)):
            raise _denial(settings, p.tp.topic) from None
        if not is_unknown_topic(exc):
            raise BrokerError(f"replaying journaled offsets from Kafka: cannot read the offsets "
                              f"of {p.tp.key()}: {exc}") from exc
        p.read.gone = True  # the topic (or partition) was deleted: every wanted offset is gone
        return None
    p.read.low, p.read.high = int(low), int(high)
    inside = p.wanted[(p.wanted >= low) & (p.wanted < high)]
    if not len(inside):
        return None
    return int(inside[0])


def _topic_denied(error: object) -> bool:
    return denied_resource(error) == "topic"


def _topic_error(consumer: Any, topic: str, timeout_s: float) -> Any:
    """The metadata's error for ``topic`` (a principal without DESCRIBE on it does not see it
    in a watermark request's metadata: its name, not "unknown partition", is the cause)."""
    try:
        md = consumer.list_topics(topic=topic, timeout=timeout_s).topics.get(topic)
    except Exception:  # noqa: BLE001 - no answer: the caller's error stands
        return None
    return None if md is None else md.error


def _on_error(consumer: Any, err: Any, p: _Partition | None, settings: ClientSettings,
              timeout_s: float) -> None:
    """End of a partition, its start moved past the read (retention ran meanwhile), or a
    denial; other errors are transient (librdkafka retries)."""
    from confluent_kafka import TopicPartition as CTopicPartition

    if is_partition_eof(err):
        if p is not None and not p.done:
            p.finish()
        return
    if is_out_of_range(err) and p is not None and not p.done:
        start = _bounds(consumer, p, settings, timeout_s)
        if start is None:
            p.finish()
        else:
            consumer.seek(CTopicPartition(p.tp.topic, p.tp.partition, start))
        return
    if _topic_denied(err):
        raise _denial(settings, p.tp.topic if p is not None else "?")
    if err.fatal():
        raise BrokerError(f"replaying journaled offsets from Kafka: {err.name()}: {err.str()}")


def _raise_denied(errors: list[Any], settings: ClientSettings) -> None:
    for e in errors:
        if _topic_denied(e):
            raise _denial(settings, "?")


def _denial(settings: ClientSettings, topic: str) -> BrokerError:
    return authorization_error(
        settings, "topic", topic, ("READ",),
        "replaying journaled offsets from Kafka (a plain consumer, assigned partitions)",
        code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
