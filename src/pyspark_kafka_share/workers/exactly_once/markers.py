"""The markers of the exactly-once workers: what a committed transaction decided.

A **marker** records the origins of one transaction's records (topic, partition, offset runs
and the outcome decided for them); markers go to a compacted topic of the workers' own,
:func:`marker_topic` of the group, and are read back with ``isolation.level=read_committed``.

- :func:`encode_marker`, :func:`decode_marker`, :func:`runs`: a marker's value.
- :class:`MarkerSet`: the committed markers, by key and by partition (pure; unit-tested).
- :class:`MarkerLog`: the read_committed reader of the marker topic and its barrier, and the
  commit check's read of the markers written since the poll's barrier began
  (:meth:`MarkerLog.check`).
- :func:`covered`, :class:`Overlap`: another attempt's marker over a transaction's origins.
- :func:`ensure_marker_topic`: creates the topic, or checks that it is compacted and has one
  partition (driver).
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
    OptionError,
    denied_resource,
    is_partition_eof,
    kafka_error,
)
from pyspark_kafka_share.workers.outcome import Outcome

__all__ = [
    "MarkerLog",
    "MarkerSet",
    "Origin",
    "Overlap",
    "attempt_prefix",
    "covered",
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
    """The committed, not yet tombstoned markers: what a worker looks records up in; and the
    markers tombstoned lately (at or above the offset :meth:`forget_retired` keeps), which
    lookups still find: a record whose acquisition was dropped unseen can reach a worker's
    barrier after its marker's tombstone (docs/design.md, "Why no record's outputs are
    committed twice", case b)."""

    _by_key: dict[bytes, dict[TopicPartition, list[tuple[int, int, Outcome]]]] = \
        field(default_factory=dict)
    _by_tp: dict[TopicPartition, list[_Run]] = field(default_factory=dict)
    _retired: dict[TopicPartition, list[_Run]] = field(default_factory=dict)
    _retired_at: dict[bytes, int] = field(default_factory=dict)  # key: its tombstone's offset

    def __len__(self) -> int:
        return len(self._by_key)

    def apply(self, key: bytes, value: bytes | None, offset: int = -1) -> int:
        """Add a committed marker (``value``) or drop one (a tombstone, ``None``, at ``offset``
        of the marker topic: kept among the retired when known); the number of the marker's
        offsets that other live markers already covered (two commits of one record)."""
        old = self._by_key.get(key)
        self._drop(key)
        if value is None:
            if old is not None and offset >= 0:
                self._retired_at[key] = offset
                _index(self._retired, key, old)
            return 0
        marker = decode_marker(value)
        overlap = sum(self._covered(tp, s, e) for tp, spans in marker.items() for s, e, _ in spans)
        self._by_key[key] = marker
        _index(self._by_tp, key, marker)
        return overlap

    def forget_retired(self, below: int) -> None:
        """Forget the retired markers whose tombstone lies below ``below``."""
        gone = {k for k, at in self._retired_at.items() if at < below}
        if not gone:
            return
        for k in gone:
            del self._retired_at[k]
        self._retired = {tp: kept for tp, runs_ in self._retired.items()
                         if (kept := [r for r in runs_ if r.key not in gone])}

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
        """The outcome a committed marker (live, else retired) decided for this record, or
        None."""
        tp = TopicPartition(topic, partition)
        found = _find(self._by_tp.get(tp), offset)
        return found if found is not None else _find(self._retired.get(tp), offset)

    def passed(self, start_offsets: Mapping[TopicPartition, int]) -> list[bytes]:
        """Keys of the markers whose every run lies below its partition's share-partition start
        offset: those records are acknowledged or archived, never delivered again."""
        return [key for key, marker in self._by_key.items()
                if all(tp in start_offsets and all(e <= start_offsets[tp] for _, e, _ in spans)
                       for tp, spans in marker.items())]

    def partitions_of(self, key: bytes) -> set[TopicPartition]:
        return set(self._by_key.get(key, {}))


def _index(by_tp: dict[TopicPartition, list[_Run]], key: bytes,
           marker: Mapping[TopicPartition, list[tuple[int, int, Outcome]]]) -> None:
    for tp, spans in marker.items():
        entries = by_tp.setdefault(tp, [])
        for s, e, outcome in spans:
            bisect.insort(entries, _Run(s, e, outcome, key), key=lambda r: r.start)


def _find(entries: list[_Run] | None, offset: int) -> Outcome | None:
    if not entries:
        return None
    i = bisect.bisect_right(entries, offset, key=lambda r: r.start)
    for r in reversed(entries[:i]):  # runs starting at or before offset
        if r.end > offset:
            return r.outcome
    return None


def ensure_marker_topic(settings: ClientSettings, option: str = "exactly_once_outputs") -> str:
    """Create the group's marker topic (compacted, one partition), or check that the existing
    one is compacted and has one partition; its name. Raises :class:`OptionError` for a topic
    that would lose markers or not order them, :class:`AuthorizationError` for a missing ACL
    (CREATE, or DESCRIBE_CONFIGS) and the broker's error otherwise
    (``_kafka.topics.ensure_group_topic``)."""
    partitions = ensure_group_topic(settings, MARKERS, option=option)
    topic = marker_topic(settings.group_id)
    if partitions != 1:
        # The commit check (MarkerLog.check) relies on one order of all markers.
        raise OptionError(option, True, f"the marker topic {topic!r} has {partitions} "
                          "partitions: the commit check needs every marker in one partition, "
                          "in one order (docs/design.md, exactly-once outputs). Delete it (the "
                          "workers create it, compacted, with one partition) or create it so")
    return topic


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
    """Offsets of this attempt's markers, as it read them back, that a live committed marker
    applied before them already covered (see docs/workers.md, "Counters", for what it misses)."""
    barrier_at: dict[int, int] = field(default_factory=dict)
    """Where the marker topic ended when the latest poll's barrier began (:meth:`catch_up`
    with ``barrier=True``): where :meth:`check` reads from."""
    seen: dict[int, int] = field(default_factory=dict)
    """Where the marker topic ended when a read (:meth:`catch_up`) last began."""
    before: tuple[dict[int, int], dict[int, int]] = field(default_factory=lambda: ({}, {}))
    """:attr:`seen` before the previous poll and before the latest (:meth:`polling`): the
    current poll's records were acquired after the first (``_kafka.share``'s dating: no
    earlier than the previous poll's start when that one came back empty, less a margin
    shorter than that poll's wait). A tombstone below it was written before they were
    acquired: the retired markers tombstoned below it are forgotten."""
    checked_at: int = -1
    """The offset of the marker the latest :meth:`check` read up to (logged with overlaps)."""
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
        probe = Consumer(settings.marker_reader(isolation_level="read_uncommitted",
                                                fetch_wait_ms=_READER_FETCH_WAIT_MS))
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

    def catch_up(self, until: float, *, barrier: bool = False) -> bool:
        """Read the committed markers up to where the topic ended when called, transactions
        still open there included (waiting for their commit or abort); False if ``until``
        (monotonic) passed first. ``barrier``: a poll's barrier (:attr:`barrier_at`)."""
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
        self.seen = target
        if barrier:
            self.barrier_at = target
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

    def polling(self) -> None:
        """Before each poll: :attr:`before` moves on (it starts as where the start's read found
        the topic's end, before the share consumer existed: ``ExactlyOnce.start``); the
        retired markers tombstoned below the current poll's bound are forgotten."""
        self.before = (self.before[1], dict(self.seen))
        bound = self.before[0].get(self.partitions[0]) if self.partitions else None
        if bound is not None:
            self.markers.forget_retired(bound)

    def _apply(self, m: Any) -> None:
        key = m.key() or b""
        overlap = self.markers.apply(key, m.value(), m.offset())
        if overlap and key.startswith(self.own_prefix):
            self.conflicts += overlap

    def check(self, origins: Sequence[Origin], key: bytes, until: float) -> list[Overlap] | None:
        """The commit check's read (docs/design.md, exactly-once outputs): the markers written
        from where the latest poll's barrier began (:attr:`barrier_at`; a committed marker
        below it was applied before the poll's records were looked up) up to this
        transaction's own (``key``, flushed),
        read_uncommitted (open and aborted transactions' too); those of other attempts that
        cover any of ``origins``. None if the own marker was not reached by ``until``
        (monotonic) or the read failed: the caller aborts."""
        from confluent_kafka import OFFSET_BEGINNING
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        (p,) = self.partitions  # one partition: ensure_marker_topic
        found: list[Overlap] = []
        try:
            start = self.barrier_at.get(p, OFFSET_BEGINNING)
            self.probe.assign([KafkaTopicPartition(self.topic, p, start)])
            while time.monotonic() <= until:
                batch = self.probe.consume(500, timeout=0) or \
                    [m for m in (self.probe.poll(0.05),) if m is not None]
                for m in batch:
                    err = m.error()
                    if err is not None and denied_resource(err) == "group":
                        continue  # its placeholder group's lookup, unused by an assign()-ed read
                    if err is not None and not is_partition_eof(err):
                        return None
                    if err is not None:
                        continue  # the end for now: the own marker may still be on its way
                    if m.key() == key:
                        self.checked_at = m.offset()
                        return found
                    n = covered(origins, m.value()) \
                        if not (m.key() or b"").startswith(self.own_prefix) else 0
                    if n:
                        found.append(Overlap(m.key() or b"", m.offset(), n))
            return None
        except Exception:  # noqa: BLE001 - a read that failed is a check that failed: abort
            return None
        finally:
            with contextlib.suppress(Exception):
                self.probe.unassign()

    def close(self) -> None:
        for c in (self.reader, self.probe):
            with contextlib.suppress(Exception):
                c.close()


@dataclass(frozen=True)
class Overlap:
    """Another attempt's marker, at ``offset`` of the marker topic, covering ``origins`` of a
    transaction's records."""

    key: bytes
    offset: int
    origins: int


def covered(origins: Sequence[Origin], value: bytes | None) -> int:
    """How many of ``origins`` the marker ``value`` covers (a tombstone, None: none)."""
    if value is None:
        return 0
    runs_of = decode_marker(value)
    return sum(1 for t, p, o, _ in origins
               for s, e, _ in runs_of.get(TopicPartition(t, p), ()) if s <= o < e)



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


