"""Scripted stand-ins for confluent-kafka's share consumer, producer and messages, and for
the native consumer, for the pure unit tests of the loops that drive them (no broker)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError

from pyspark_kafka_share._kafka.native.consumer import ShareRecord
from pyspark_kafka_share.workers.exactly_once import MarkerSet, Origin
from pyspark_kafka_share.workers.exactly_once.markers import Overlap


class Msg:
    def __init__(self, offset: int, dc: int = 1, value: bytes = b"v", *, topic: str = "in",
                 partition: int = 0, error: Any = None) -> None:
        self._offset, self._dc, self._value = offset, dc, value
        self._topic, self._partition, self._error = topic, partition, error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k%d" % self._offset

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[tuple[str, bytes]]:
        return [("h", b"1")]

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def delivery_count(self) -> int:
        return self._dc

    def error(self) -> Any:
        return self._error


class TP:
    def __init__(self) -> None:
        self.topic, self.partition = "in", 0

    def __hash__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TP)


class FakeConsumer:
    """Returns the scripted polls, then nothing; records every acknowledgement."""

    def __init__(self, polls: list[list[Msg]]) -> None:
        self.polls = list(polls)
        self.acks: dict[int, str] = {}
        self.acked: set[tuple[int, int, int]] = set()
        self.pending: list[Msg] = []
        self.closed = False

    def subscribe(self, topics: list[str]) -> None:
        pass

    def poll(self, timeout: float) -> list[Msg]:
        assert not self.pending, "polled with unacknowledged records"
        if not self.polls:
            time.sleep(0.01)
            return []
        self.pending = list(self.polls.pop(0))
        return list(self.pending)

    def acknowledge(self, m: Msg, kind: Any) -> None:
        delivery = (m.partition(), m.offset(), m.delivery_count())
        assert delivery not in self.acked, f"acknowledged twice: {delivery}"
        self.acked.add(delivery)
        self.acks[m.offset()] = kind.name  # the latest delivery's outcome
        self.pending = [p for p in self.pending if p is not m]

    def commit_sync(self, timeout: float) -> dict[TP, None]:
        return {TP(): None}

    def close(self) -> None:
        self.closed = True


class FakeProducer:
    """Delivers to ``sent`` unless ``refuse(topic, value)`` says no (with ``error``: the
    record's own fault by default; a ``KafkaError`` of a broker fault for a transient one)."""

    def __init__(self, refuse: Callable[[str, bytes | None], bool] = lambda t, v: False,
                 error: Any = None) -> None:
        self.refuse = refuse
        self.error = error or KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
        self.sent: list[tuple[str, bytes | None, dict[str, bytes]]] = []
        self.queue: list[tuple[Any, str, bytes | None, Any]] = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                headers: Any = None, on_delivery: Any = None) -> None:
        self.queue.append((on_delivery, topic, value, headers))

    def flush(self, timeout: float) -> int:
        for cb, topic, value, headers in self.queue:
            if self.refuse(topic, value):
                cb(self.error, None)
            else:
                self.sent.append((topic, value, dict(headers or [])))
                cb(None, None)
        self.queue = []
        return 0

    def poll(self, timeout: float) -> int:
        return 0


class FakeMarkerLog:
    """A marker log with nothing committed by others (the barrier is always done) and, for
    the commit check, the overlaps ``overlaps`` gives each transaction's origins (default:
    none; None: the check's read failed)."""

    def __init__(self, overlaps: Callable[[Sequence[Origin]], list[Overlap] | None]
                 = lambda origins: []) -> None:
        self.markers, self.errors, self.conflicts = MarkerSet(), list[Any](), 0
        self.overlaps = overlaps
        self.barrier_at: dict[int, int] = {}
        self.checked_at = -1
        self.checked: list[list[Origin]] = []
        self.stalled_s = 0.0

    def catch_up(self, until: float, *, barrier: bool = False) -> bool:
        return True

    def polling(self) -> None:
        pass

    def check(self, origins: Sequence[Origin], key: bytes, until: float) -> list[Overlap] | None:
        self.checked.append(list(origins))
        return self.overlaps(origins)

    def close(self) -> None:
        pass


class FakeNative:
    """A scripted native consumer: the polls given, then nothing; every acknowledgement
    recorded; ``commit_sync`` answers ``renew_code`` for a RENEW, 0 otherwise; ``errors``:
    the connection failures ``take_errors`` hands out (once)."""

    def __init__(self, polls: list[list[ShareRecord]], renew_code: int = 0) -> None:
        self.polls = list(polls)
        self.renew_code = renew_code
        self.acks: dict[int, str] = {}
        self.renews = 0  # ShareAcknowledge requests with RENEWs
        self.queued: list[tuple[ShareRecord, str]] = []
        self.closed = False
        self.errors: list[Any] = []

    def poll(self, timeout_s: float, max_records: int | None = None, *,
             soft_cap: int | None = None) -> list[ShareRecord]:
        if not self.polls:
            time.sleep(0.01)
            return []
        return self.polls.pop(0)

    def acknowledge(self, record: ShareRecord, kind: str) -> None:
        self.queued.append((record, kind))
        if kind != "RENEW":
            self.acks[record.offset] = kind

    def commit_sync(self) -> dict[tuple[str, int], int]:
        queued, self.queued = self.queued, []
        renew = any(kind == "RENEW" for _, kind in queued)
        self.renews += renew
        code = self.renew_code if renew else 0
        return {(r.topic, r.partition): code for r, _ in queued}

    def take_errors(self) -> list[Any]:
        errors, self.errors = self.errors, []
        return errors

    def close(self) -> None:
        self.closed = True
