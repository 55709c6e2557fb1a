"""Share sessions (KIP-932) to partition leaders, and the records a consumer holds.

A :class:`LeaderSession` is one broker's share session: epoch 0 opens it with every assigned
partition that broker leads; each later request names only the partitions added since, or
those with acknowledgements to piggyback, and lists the ones no longer assigned as
forgotten; the epoch then advances (wrapping from 2^31-1 to 1); -1 closes it. A session the
broker no longer knows (SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH) or a lost
connection resets it to epoch 0, as Kafka's ShareSessionHandler does; the acknowledgements
that were in that request fail with the error (their records are redelivered after their
lock expires).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from pyspark_kafka_share._kafka.protocol.client import BrokerConnection
from pyspark_kafka_share._kafka.protocol.consume import (
    AckRanges,
    AckType,
    ShareSessionRequest,
    TopicPartitionId,
)

INT32_MAX = 0x7FFFFFFF


@dataclass(frozen=True, slots=True)
class ShareRecord:
    """A record acquired by the native consumer. ``deadline``: when its acquisition lock
    ends, on ``time.monotonic()``'s clock (a RENEW moves it); ``delivery_count``: 1 on the
    first delivery; ``log_append_time``: ``timestamp_ms`` is the broker's LogAppendTime, not
    the producer's CreateTime."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    delivery_count: int
    deadline: float
    log_append_time: bool = False


@dataclass
class LeaderSession:
    """The share session with one leader (``node``) and its connection."""

    node: int
    conn: BrokerConnection
    epoch: int = 0
    members: set[TopicPartitionId] = field(default_factory=set)

    def request(self, group: str, member_id: str, assigned: Iterable[TopicPartitionId],
                acks: Mapping[TopicPartitionId, AckRanges]) -> ShareSessionRequest:
        """The next ShareFetch's session part for the ``assigned`` partitions it leads."""
        wanted = set(assigned)
        named: dict[TopicPartitionId, AckRanges] = {tp: () for tp in wanted - self.members}
        named.update(acks)
        forgotten = sorted(self.members - wanted) if self.epoch else []
        return ShareSessionRequest(group, member_id, self.epoch, named, forgotten)

    def advanced(self, req: ShareSessionRequest, fetch: bool) -> None:
        """The broker took ``req``: the session now holds what it named (a fetch) minus
        what it forgot, at the next epoch."""
        if fetch:
            self.members |= set(req.partitions)
        self.members -= set(req.forgotten)
        self.epoch = 1 if self.epoch >= INT32_MAX else self.epoch + 1

    def reset(self) -> None:
        self.epoch, self.members = 0, set()


@dataclass
class Held:
    """The records the consumer holds (delivered, not yet acknowledged) and the
    acknowledgements waiting to be sent, per ``(topic id, partition)``."""

    records: dict[TopicPartitionId, dict[int, ShareRecord | None]] = \
        field(default_factory=dict)
    """Per partition, the held offsets and their records (None: delivered as Arrow columns,
    no object kept)."""
    pending: dict[TopicPartitionId, dict[int, AckType]] = field(default_factory=dict)

    def hold(self, tp: TopicPartitionId, record: ShareRecord) -> None:
        self.records.setdefault(tp, {})[record.offset] = record

    def hold_offsets(self, tp: TopicPartitionId, offsets: Iterable[int]) -> None:
        """Hold records delivered as columns, by offset only."""
        self.records.setdefault(tp, {}).update(dict.fromkeys(offsets))

    def gap(self, tp: TopicPartitionId, offset: int) -> None:
        """An acquired offset with no record for the consumer: acknowledged as GAP."""
        self.pending.setdefault(tp, {})[offset] = AckType.GAP

    def acknowledge(self, tp: TopicPartitionId, offset: int, kind: AckType) -> bool:
        """Queue ``kind`` for a held record; False when it is not held (already settled)."""
        held = self.records.get(tp, {})
        if offset not in held:
            return False
        if kind != AckType.RENEW:
            del held[offset]
        self.pending.setdefault(tp, {})[offset] = kind
        return True

    def acknowledge_offsets(self, tp: TopicPartitionId, offsets: Sequence[int],
                            kind: AckType) -> int | None:
        """:meth:`acknowledge` for each of ``offsets`` (a poll's, thousands: without a call
        per offset), all or none: the first offset not held, or given twice, else None."""
        held = self.records.get(tp, {})
        wanted = set(offsets)
        if len(wanted) != len(offsets) or not held.keys() >= wanted:
            seen: set[int] = set()
            for offset in offsets:
                if offset not in held or offset in seen:
                    return offset
                seen.add(offset)
        if kind != AckType.RENEW:
            if len(wanted) == len(held):
                held.clear()
            else:
                for offset in offsets:
                    del held[offset]
        self.pending.setdefault(tp, {}).update(dict.fromkeys(offsets, kind))
        return None

    def take(self, tps: Iterable[TopicPartitionId]) -> dict[TopicPartitionId, AckRanges]:
        """Remove and return the pending acknowledgements of ``tps`` as ranges."""
        out: dict[TopicPartitionId, AckRanges] = {}
        for tp in tps:
            acks = self.pending.pop(tp, None)
            if acks:
                out[tp] = ranges(acks)
        return out

    def release_all(self) -> None:
        """Queue RELEASE for every held record (close())."""
        for tp, held in self.records.items():
            for offset in held:
                self.pending.setdefault(tp, {})[offset] = AckType.RELEASE
        self.records = {}

    def renewed(self, tp: TopicPartitionId, offsets: Iterable[int], lock_ms: int) -> None:
        """Move the deadline of renewed records still held to now + the lock duration."""
        held = self.records.get(tp, {})
        deadline = time.monotonic() + lock_ms / 1000.0
        for offset in offsets:
            rec = held.get(offset)
            if rec is not None:
                held[offset] = _with_deadline(rec, deadline)


def _with_deadline(rec: ShareRecord, deadline: float) -> ShareRecord:
    return dataclasses.replace(rec, deadline=deadline)


def ranges(acks: Mapping[int, AckType]) -> list[tuple[int, int, list[int]]]:
    """Acknowledgements as batches of consecutive offsets of one type each (numpy: a poll's
    are thousands)."""
    n = len(acks)
    if not n:
        return []
    offsets = np.fromiter(acks.keys(), dtype=np.int64, count=n)
    kinds = np.fromiter(acks.values(), dtype=np.int64, count=n)
    order = np.argsort(offsets, kind="stable")
    offsets, kinds = offsets[order], kinds[order]
    breaks = np.flatnonzero((np.diff(offsets) != 1) | (np.diff(kinds) != 0)) + 1
    firsts = np.concatenate(([0], breaks))
    lasts = np.concatenate((breaks, [n])) - 1
    return [(first, last, [kind]) for first, last, kind in
            zip(offsets[firsts].tolist(), offsets[lasts].tolist(), kinds[firsts].tolist(),
                strict=True)]
