"""The native consumer's connection failures, reported as librdkafka reports its own.

librdkafka tells a client about lost connections only through ``error_cb`` (``_TRANSPORT``:
one broker's connection; ``_ALL_BROKERS_DOWN``: none left), while its polls just come back
empty. The native consumer reports the same two events (:class:`ConnectionEvent`, read like
a confluent-kafka ``KafkaError``: ``code()``, ``name()``, ``str()``, ``fatal()``), taken by
``take_errors()``, so that the checks above the consumer seam (``BrokerWatch``,
``errors.is_all_brokers_down``) judge both clients alike: an outage is never "no data".
"""

from __future__ import annotations

import builtins
import threading
from collections import deque
from dataclasses import dataclass, field

__all__ = ["ALL_BROKERS_DOWN", "TRANSPORT", "ConnectionEvent", "ConnectionEvents"]

# librdkafka's codes of the two events (errors.is_all_brokers_down reads -187).
TRANSPORT = -195
ALL_BROKERS_DOWN = -187
_NAMES = {TRANSPORT: "_TRANSPORT", ALL_BROKERS_DOWN: "_ALL_BROKERS_DOWN"}


@dataclass(frozen=True)
class ConnectionEvent:
    """One connection failure: ``kind`` (:data:`TRANSPORT` or :data:`ALL_BROKERS_DOWN`) and
    what failed."""

    kind: int
    reason: str

    def code(self) -> int:
        return self.kind

    def name(self) -> str:
        return _NAMES[self.kind]

    def str(self) -> str:
        return self.reason

    def fatal(self) -> bool:
        return False  # the consumer reconnects by itself, as librdkafka does

    def retriable(self) -> bool:
        return True

    def __str__(self) -> builtins.str:
        return f"{self.name()}: {self.reason}"


@dataclass(eq=False)
class ConnectionEvents:
    """The events not yet taken, from the consumer's thread and its heartbeat thread. Bounded
    (a consumer whose caller never takes them keeps the latest ``limit``)."""

    limit: int = 64
    _events: deque[ConnectionEvent] = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._events = deque(maxlen=self.limit)

    def transport(self, reason: str) -> None:
        """A broker's connection was lost or refused."""
        self._add(ConnectionEvent(TRANSPORT, reason))

    def all_down(self, reason: str) -> None:
        """No broker answered (neither a known one nor a bootstrap server)."""
        self._add(ConnectionEvent(ALL_BROKERS_DOWN, reason))

    def _add(self, event: ConnectionEvent) -> None:
        with self._lock:
            self._events.append(event)

    def take(self) -> list[ConnectionEvent]:
        """The events since the last call, oldest first."""
        with self._lock:
            out = list(self._events)
            self._events.clear()
        return out
