"""The markers of the exactly-once workers: what a committed transaction decided.

A **marker** records the origins of one transaction's records (topic, partition, offset runs
and the outcome decided for them); markers go to a compacted topic of the workers' own,
:func:`marker_topic` of the group, and are read back with ``isolation.level=read_committed``.

- :func:`encode_marker`, :func:`decode_marker`, :func:`runs`: a marker's value.
- :class:`MarkerSet`: the committed markers, by key and by partition (pure; unit-tested).
- :class:`MarkerLog`: the read_committed reader of the marker topic and its barrier.
- :func:`ensure_marker_topic`: creates the topic, or checks that it is compacted (driver).
- :func:`marker_key`, :func:`attempt_prefix`, :func:`origins_of`: a transaction's marker.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share._kafka.topics import MARKERS, ensure_group_topic, group_topic_name
from pyspark_kafka_share.errors import (
    AuthorizationError,
    BrokerError,
    ErrorCode,
    denied_resource,
    is_partition_eof,
    kafka_error,
)
from pyspark_kafka_share.workers.outcome import Outcome

__all__ = [
    "MarkerLog",
    "MarkerSet",
    "Origin",
    "attempt_prefix",
    "decode_marker",
    "encode_marker",
    "ensure_marker_topic",
    "marker_key",
    "marker_topic",
    "origins_of",
    "runs",
]

Origin = tuple[str, int, int, Outcome]
"""(topic, partition, offset, outcome decided) of one record a marker covers."""

_CODES = {Outcome.ACCEPT: "A", Outcome.REJECT: "R"}
_OUTCOMES = {v: k for k, v in _CODES.items()}

def marker_topic(group: str) -> str:
    """The marker topic of share group ``group``: ``kafka-share-markers.<group>`` (characters a
    topic name cannot hold, or a name too long, are replaced by a hash)."""
    return group_topic_name(group, MARKERS.purpose)



def runs(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted, de-duplicated ``offsets`` as ``[start, end)`` runs of consecutive offsets."""
    out: list[tuple[int, int]] = []
    for o in sorted(set(offsets)):
        if out and out[-1][1] == o:
            out[-1] = (out[-1][0], o + 1)
        else:
            out.append((o, o + 1))
    return out


def encode_marker(origins: Iterable[Origin]) -> bytes:
    """A marker's value: per (topic, partition, outcome), the offset runs (compact JSON)."""
    grouped: dict[tuple[str, int, str], list[int]] = {}
    for topic, partition, offset, outcome in origins:
        grouped.setdefault((topic, partition, _CODES[outcome]), []).append(offset)
    body = [[t, p, code, [list(r) for r in runs(offs)]]
            for (t, p, code), offs in sorted(grouped.items())]
    return json.dumps({"v": 1, "o": body}, separators=(",", ":")).encode()


@dataclass(frozen=True)
class _Run:
    start: int
    end: int
    outcome: Outcome
    key: bytes


def decode_marker(value: bytes) -> dict[TopicPartition, list[tuple[int, int, Outcome]]]:
    """A marker's runs per partition (``[start, end)``, outcome)."""
    body = json.loads(value)
    out: dict[TopicPartition, list[tuple[int, int, Outcome]]] = {}
    for topic, partition, code, spans in body["o"]:
        out.setdefault(TopicPartition(topic, int(partition)), []).extend(
            (int(s), int(e), _OUTCOMES[code]) for s, e in spans)
    return out


@dataclass
class MarkerSet:
    """The committed, not yet tombstoned markers: what a worker looks records up in."""

    _by_key: dict[bytes, dict[TopicPartition, list[tuple[int, int, Outcome]]]] = \
        field(default_factory=dict)
    _by_tp: dict[TopicPartition, list[_Run]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._by_key)

    def apply(self, key: bytes, value: bytes | None) -> int:
        """Add a committed marker (``value``) or drop one (a tombstone, ``None``); the number of
        its offsets that other live markers already covered (two commits of one record)."""
        self._drop(key)
        if value is None:
            return 0
        marker = decode_marker(value)
        overlap = sum(self._covered(tp, s, e) for tp, spans in marker.items() for s, e, _ in spans)
        self._by_key[key] = marker
        for tp, spans in marker.items():
            entries = self._by_tp.setdefault(tp, [])
            for s, e, outcome in spans:
                bisect.insort(entries, _Run(s, e, outcome, key), key=lambda r: r.start)
        return overlap

    def _covered(self, tp: TopicPartition, start: int, end: int) -> int:
        return sum(max(0, min(end, r.end) - max(start, r.start))
                   for r in self._by_tp.get(tp, ()))

    def _drop(self, key: bytes) -> None:
        old = self._by_key.pop(key, None)
        for tp in old or ():
            kept = [r for r in self._by_tp.get(tp, ()) if r.key != key]
            if kept:
                self._by_tp[tp] = kept
            else:
                self._by_tp.pop(tp, None)

    def lookup(self, topic: str, partition: int, offset: int) -> Outcome | None:
        """The outcome a committed marker decided for this record, or None."""
        entries = self._by_tp.get(TopicPartition(topic, partition))
        if not entries:
            return None
        i = bisect.bisect_right(entries, offset, key=lambda r: r.start)
        for r in reversed(entries[:i]):  # runs starting at or before offset
            if r.end > offset:
                return r.outcome
        return None

    def passed(self, start_offsets: Mapping[TopicPartition, int]) -> list[bytes]:
        """Keys of the markers whose every run lies below its partition's share-partition start
        offset: those records are acknowledged or archived, never delivered again."""
        return [key for key, marker in self._by_key.items()
                if all(tp in start_offsets and all(e <= start_offsets[tp] for _, e, _ in spans)
                       for tp, spans in marker.items())]

    def partitions_of(self, key: bytes) -> set[TopicPartition]:
        return set(self._by_key.get(key, {}))


def ensure_marker_topic(settings: ClientSettings, option: str = "exactly_once_outputs") -> str:
    """Create the group's marker topic (compacted, one partition), or check that the existing
    one is compacted; its name. Raises :class:`OptionError` for a topic that would lose
    markers, :class:`AuthorizationError` for a missing ACL (CREATE, or DESCRIBE_CONFIGS) and
    the broker's error otherwise (``_kafka.topics.ensure_group_topic``)."""
    ensure_group_topic(settings, MARKERS, option=option)
    return marker_topic(settings.group_id)


_READER_FETCH_WAIT_MS = 20


@dataclass(eq=False)
class MarkerLog:
    """The marker topic, read with ``read_committed`` into a :class:`MarkerSet`."""

    topic: str
    reader: Any
    probe: Any  # read_uncommitted: the topic's high watermark
    partitions: list[int]
    timeout_s: float
    own_prefix: bytes
    markers: MarkerSet = field(default_factory=MarkerSet)
    errors: list[Any] = field(default_factory=list)
    eof: dict[int, int] = field(default_factory=dict)
    conflicts: int = 0
    """Offsets a marker of this worker covered that another committed marker already did."""
    stalled_s: float = 0.0
    """The last :meth:`catch_up`'s time after the reader first stood at a transaction still
    open below the target (its partition's end of committed records short of the target)."""

    @classmethod
    def open(cls, settings: ClientSettings, own_prefix: bytes) -> MarkerLog:
        from confluent_kafka import OFFSET_BEGINNING, Consumer
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        topic = marker_topic(settings.group_id)
        errors: list[Any] = []
        # The broker holds a read_committed fetch for fetch.wait.max.ms even after a commit
        # made records readable (measured: the barrier took ~500 ms minus the time since the
        # last commit with the default 500): short fetch waits keep it to tens of ms.
        reader = Consumer(settings.marker_reader(isolation_level="read_committed",
                                                 fetch_wait_ms=_READER_FETCH_WAIT_MS,
                                                 error_cb=errors.append))
        probe = Consumer(settings.marker_reader(isolation_level="read_uncommitted"))
        try:
            md = reader.list_topics(topic, timeout=settings.timeout_s)
            meta = md.topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                raise BrokerError(f"the workers' marker topic {topic!r} does not exist (it is "
                                  "created by start_workers with exactly_once_outputs=True)")
            parts = sorted(meta.partitions)
            reader.assign([KafkaTopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        except BaseException:
            reader.close()
            probe.close()
            raise
        return cls(topic, reader, probe, parts, settings.timeout_s, own_prefix, errors=errors)

    def catch_up(self, until: float) -> bool:
        """Read the committed markers up to where the topic ended when called, transactions
        still open there included (waiting for their commit or abort); False if ``until``
        (monotonic) passed first."""
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        try:
            target = {p: self.probe.get_watermark_offsets(
                KafkaTopicPartition(self.topic, p),
                timeout=max(0.1, min(self.timeout_s, until - time.monotonic())))[1]
                for p in self.partitions}
        except Exception as exc:  # noqa: BLE001 - unreachable now: the barrier is not done
            err = kafka_error(exc)
            if err is not None:  # a KafkaError: session_lost() judges it
                self.errors.append(err)
            return False
        self.stalled_s, stalled = 0.0, None  # since when the reader stands at an open one
        while any(self.eof.get(p, -1) < end for p, end in target.items()):
            if time.monotonic() > until:
                self.stalled_s = 0.0 if stalled is None else time.monotonic() - stalled
                return False
            # What is there at once; else wait for one (consume would wait out its timeout).
            batch = self.reader.consume(500, timeout=0) or \
                [m for m in (self.reader.poll(0.05),) if m is not None]
            for m in batch:
                err = m.error()
                if err is None:
                    self._apply(m)
                elif is_partition_eof(err):
                    self.eof[m.partition()] = m.offset()
                    if stalled is None and m.offset() < target.get(m.partition(), -1):
                        stalled = time.monotonic()  # read_committed's end: the LSO
                else:
                    self.errors.append(err)
                    if denied_resource(err) == "topic":  # never passes
                        raise AuthorizationError(
                            ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"reading the workers' "
                            f"marker topic {self.topic!r} (Read)", err.str(),
                            hint="Grant the workers' principal READ on it (docs/workers.md, "
                            "exactly-once outputs)")
                    if err.fatal():
                        raise BrokerError(f"reading the marker topic {self.topic!r} failed: "
                                          f"{err}")
        self.stalled_s = 0.0 if stalled is None else time.monotonic() - stalled
        return True

    def _apply(self, m: Any) -> None:
        key = m.key() or b""
        overlap = self.markers.apply(key, m.value())
        if overlap and key.startswith(self.own_prefix):
            self.conflicts += overlap

    def close(self) -> None:
        for c in (self.reader, self.probe):
            with contextlib.suppress(Exception):
                c.close()



def marker_key(prefix: bytes, seq: int) -> bytes:
    """A marker's key: the attempt's prefix (unique per attempt) and its transaction
    number."""
    return prefix + str(seq).encode()


def attempt_prefix(worker: int, attempt: int) -> bytes:
    return f"{worker}:{attempt}:{uuid.uuid4().hex[:8]}:".encode()


def origins_of(items: Sequence[tuple[Any, Outcome]]) -> list[Origin]:
    """The origins of ``(message, outcome)`` pairs that a marker records (ACCEPT, REJECT)."""
    return [(m.topic(), m.partition(), m.offset(), o) for m, o in items
            if o in (Outcome.ACCEPT, Outcome.REJECT)]


