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
import hashlib
import json
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark_kafka_share._kafka.group import admin_client
from pyspark_kafka_share._kafka.logs import client_config
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share.errors import (
    AuthorizationError,
    BrokerError,
    ErrorCode,
    OptionError,
    from_client_error,
)
from pyspark_kafka_share.workers.outcome import Outcome

__all__ = [
    "MARKER_TOPIC_CONFIG",
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

MARKER_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    # Compaction only cleans closed segments: roll them often, so that markers and their
    # tombstones do not pile up for the broker default of 7 days.
    "segment.ms": "600000",
    "delete.retention.ms": "3600000",
    "min.cleanable.dirty.ratio": "0.1",
}
"""How :func:`ensure_marker_topic` creates the marker topic (one partition)."""

_LEGAL = re.compile(r"[^A-Za-z0-9._-]")


def marker_topic(group: str) -> str:
    """The marker topic of share group ``group``: ``kafka-share-markers.<group>`` (characters a
    topic name cannot hold, or a name too long, are replaced by a hash)."""
    name = _LEGAL.sub("_", group)
    if name != group or len(name) > 200:
        name = f"{name[:180]}-{hashlib.sha256(group.encode()).hexdigest()[:12]}"
    return f"kafka-share-markers.{name}"



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
    markers, and the broker's error (an ACL: CREATE, or DESCRIBE_CONFIGS) otherwise."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import NewTopic

    topic = marker_topic(settings.group_id)
    admin = admin_client(settings)
    timeout = settings.timeout_s
    try:
        future = admin.create_topics([NewTopic(topic, 1, replication_factor=-1,
                                               config=dict(MARKER_TOPIC_CONFIG))],
                                     request_timeout=timeout)[topic]
        try:
            future.result(timeout)
        except Exception as exc:  # "already exists" is what we want
            code = _code(exc)
            if code in _DENIED and not _listed(admin, topic, timeout):
                raise _denied(settings, topic, "Create", "creating the workers' marker topic "
                              "(or create it beforehand: compacted, one partition)") from None
            if code != KafkaError.TOPIC_ALREADY_EXISTS and code not in _DENIED:
                raise
        try:
            configs = _topic_configs(admin, topic, timeout)
        except Exception as exc:
            if _code(exc) in _DENIED:
                raise _denied(settings, topic, "DescribeConfigs", "checking that the workers' "
                              "marker topic is compacted") from None
            raise
    except Exception as exc:
        raise from_client_error(exc, f"the workers' marker topic {topic!r} could not be created "
                                "or described", "Grant the workers' principal CREATE (or "
                                "create the topic, compacted) and DESCRIBE_CONFIGS on it; see "
                                "docs/workers.md, exactly-once outputs") from exc
    policy = str(configs["cleanup.policy"].value) if "cleanup.policy" in configs else ""
    if "compact" not in policy or "delete" in policy:
        raise OptionError(option, True, f"the marker topic {topic!r} has cleanup.policy="
                          f"{policy!r}: markers would be deleted by retention while records "
                          "they cover can still be redelivered. Set cleanup.policy=compact on "
                          "it (or delete it: the workers create it)")
    return topic


_DENIED = frozenset({ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                     ErrorCode.CLUSTER_AUTHORIZATION_FAILED})


def _code(exc: BaseException) -> int | None:
    """The librdkafka/Kafka error code of a client exception, if it has one."""
    err = exc.args[0] if exc.args else None
    code = getattr(err, "code", None)
    return int(code()) if callable(code) else None


def _listed(admin: Any, topic: str, timeout_s: float) -> bool:
    with contextlib.suppress(Exception):
        meta = admin.list_topics(topic, timeout=timeout_s).topics.get(topic)
        return meta is not None and meta.error is None and bool(meta.partitions)
    return False


def _denied(settings: ClientSettings, topic: str, operation: str, what: str) -> BrokerError:
    from pyspark_kafka_share._kafka.access import authorization_error

    return authorization_error(settings, "topic", topic, (operation,),
                               f"{what} (exactly_once_outputs)",
                               code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)


def _topic_configs(admin: Any, topic: str, timeout_s: float) -> dict[str, Any]:
    """The topic's configs; a topic just created is unknown to the broker for a moment."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import ConfigResource

    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            configs: dict[str, Any] = admin.describe_configs(
                [resource], request_timeout=timeout_s)[resource].result(timeout_s)
            return configs
        except Exception as exc:
            err = exc.args[0] if exc.args else None
            code = getattr(err, "code", lambda: None)()
            if code != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _connection(settings: ClientSettings) -> dict[str, Any]:
    """A classic consumer's settings for the marker topic: the cluster's connection and
    security settings, no group (``assign``, no commits)."""
    return {**settings.admin(), "group.id": f"kafka-share-markers-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False, "enable.partition.eof": True,
            "auto.offset.reset": "earliest"}


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

    @classmethod
    def open(cls, settings: ClientSettings, own_prefix: bytes) -> MarkerLog:
        from confluent_kafka import OFFSET_BEGINNING, Consumer
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        topic = marker_topic(settings.group_id)
        errors: list[Any] = []
        base = {**_connection(settings), "error_cb": errors.append}
        # The broker holds a read_committed fetch for fetch.wait.max.ms even after a commit
        # made records readable (measured: the barrier took ~500 ms minus the time since the
        # last commit with the default 500): short fetch waits keep it to tens of ms.
        reader = Consumer(client_config({**base, "isolation.level": "read_committed",
                                         "fetch.wait.max.ms": _READER_FETCH_WAIT_MS}))
        probe = Consumer(client_config({**_connection(settings),
                                        "isolation.level": "read_uncommitted"}))
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
        from confluent_kafka import KafkaError
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        try:
            target = {p: self.probe.get_watermark_offsets(
                KafkaTopicPartition(self.topic, p),
                timeout=max(0.1, min(self.timeout_s, until - time.monotonic())))[1]
                for p in self.partitions}
        except Exception as exc:  # noqa: BLE001 - unreachable now: the barrier is not done
            err = exc.args[0] if exc.args else None
            if hasattr(err, "name"):  # a KafkaError: session_lost() judges it
                self.errors.append(err)
            return False
        while any(self.eof.get(p, -1) < end for p, end in target.items()):
            if time.monotonic() > until:
                return False
            # What is there at once; else wait for one (consume would wait out its timeout).
            batch = self.reader.consume(500, timeout=0) or \
                [m for m in (self.reader.poll(0.05),) if m is not None]
            for m in batch:
                err = m.error()
                if err is None:
                    self._apply(m)
                elif err.code() == KafkaError._PARTITION_EOF:
                    self.eof[m.partition()] = m.offset()
                else:
                    self.errors.append(err)
                    if err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:  # never passes
                        raise AuthorizationError(
                            ErrorCode.TOPIC_AUTHORIZATION_FAILED, f"reading the workers' "
                            f"marker topic {self.topic!r} (Read)", err.str(),
                            hint="Grant the workers' principal READ on it (docs/workers.md, "
                            "exactly-once outputs)")
                    if err.fatal():
                        raise BrokerError(f"reading the marker topic {self.topic!r} failed: "
                                          f"{err}")
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


