"""Share-group membership for the native consumer: ShareGroupHeartbeat on a thread of its
own (as Kafka's Java client heartbeats from its background thread), so that a consumer
whose caller is busy between polls stays in the group.

States: JOINING (epoch 0, a member id of the client's own, KIP-1082) -> STABLE (the epoch
the coordinator gave; the assignment it sent) -> LEAVING (epoch -1) -> LEFT. A fenced or
unknown member (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID) rejoins at epoch 0 with the same
member id and an empty assignment, as the Java client does; a moving coordinator
(NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS) and lost
connections are looked up and retried with a backoff (each lost connection reported to
``events``: ``_TRANSPORT``, or ``_ALL_BROKERS_DOWN`` when no bootstrap server answered); any
other error is fatal and raised by the consumer's next ``poll()``.

A member the coordinator answered without partitions beats again every ``EAGER_S`` for up to
``EAGER_WINDOW_S``, then at the broker's interval (``group.share.heartbeat.interval.ms``, 5 s
by default): the coordinator assigns a share partition only once its state is initialized
(which it starts after answering the heartbeat that subscribed the group) and recomputes a
share group's assignment at most every ``share.assignment.interval.ms`` (Kafka 4.3+, 1 s by
default), so a new member's partitions come with a later heartbeat, about 1 s after its join
(measured on Kafka 4.4: docs/benchmarks/README.md, the source's spread). The coordinator
answers a heartbeat at any time (Kafka's Java consumer sends one at once after reconciling
an assignment); the interval only bounds how long it waits for one.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from pyspark_kafka_share._kafka.native.events import ConnectionEvents
from pyspark_kafka_share._kafka.protocol import consume
from pyspark_kafka_share._kafka.protocol import messages as msg
from pyspark_kafka_share._kafka.protocol.client import BrokerConnection
from pyspark_kafka_share._kafka.protocol.codec import ApiKey
from pyspark_kafka_share.errors import (
    BrokerError,
    ErrorCode,
    KafkaConnectionError,
    KafkaShareError,
    error_for,
)

_log = logging.getLogger(__name__)

Connect = Callable[[str, int, float], BrokerConnection]
"""``connect(host, port, deadline)``: a negotiated (and authenticated) connection."""

_MOVING = {ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE,
           ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}
_REJOIN = {ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID}

EAGER_S = 0.2
"""The wait before heartbeating again while the member has no partition (see above)."""
EAGER_WINDOW_S = 3.0
"""How long after a join answered without partitions the member heartbeats every
``EAGER_S``: three assignment intervals of the broker's default; a member that still has none
(its topic has no partition yet) heartbeats at the broker's interval."""


class Membership:
    """One member of share group ``group`` subscribed to ``topics``. ``assignment()`` is
    ``{topic id: partitions}`` as last sent by the coordinator."""

    def __init__(self, group: str, topics: tuple[str, ...], connect: Connect,
                 bootstrap: list[tuple[str, int]], timeout_s: float, *,
                 events: ConnectionEvents | None = None) -> None:
        self.group, self.topics = group, topics
        self.events = events if events is not None else ConnectionEvents()
        self.member_id = _member_id()
        self.epoch = 0
        self.rejoins = 0  # times the member was fenced or unknown: its acquisitions are gone
        self._connect, self._bootstrap, self._timeout_s = connect, bootstrap, timeout_s
        self._conn: BrokerConnection | None = None
        self._lock = threading.Lock()
        self._assignment: dict[str, tuple[int, ...]] = {}
        self._joined = threading.Event()
        self._stop = threading.Event()
        self._interval_s = 1.0
        self._unassigned_since: float | None = None  # the first answer without partitions
        self.fatal: KafkaShareError | None = None
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"share-heartbeat-{group}")

    def start(self) -> None:
        self._thread.start()

    def assignment(self) -> dict[str, tuple[int, ...]]:
        with self._lock:
            return dict(self._assignment)

    def wait_joined(self, timeout_s: float) -> bool:
        return self._joined.wait(timeout_s)

    # -- the heartbeat loop --

    def _run(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                self._beat()
                backoff = 0.05
                self._stop.wait(self._next_wait())
            except (KafkaConnectionError, _Retry) as exc:
                _log.debug("share group %r heartbeat: %s; retrying", self.group, exc)
                if isinstance(exc, _NoBroker):
                    self.events.all_down(f"share group {self.group!r} heartbeat: {exc}")
                elif isinstance(exc, KafkaConnectionError):
                    self.events.transport(f"share group {self.group!r} coordinator: {exc}")
                self._close_conn()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 1.0)
            except KafkaShareError as exc:
                self._fail(exc)
                return
            except Exception as exc:  # noqa: BLE001 - a dead heartbeat thread must be seen
                self._fail(BrokerError(f"share group {self.group!r}: the heartbeat thread "
                                       f"failed: {exc!r}"))
                return

    def _fail(self, exc: KafkaShareError) -> None:
        self.fatal = exc
        self._joined.set()  # wake a waiting consumer: its poll() raises the error

    def _beat(self) -> None:
        deadline = time.monotonic() + self._timeout_s
        conn = self._coordinator(deadline)
        topics = list(self.topics) if self.epoch == 0 else None
        answer = self._send(conn, self.epoch, topics, deadline)
        code = answer.error_code
        if code in _REJOIN:
            _log.info("share group %r: member %s %s; rejoining", self.group, self.member_id,
                      ErrorCode(code).name)
            with self._lock:
                self.epoch, self._assignment = 0, {}
                self.rejoins += 1
            self._unassigned_since = None  # eager again after the rejoin
            raise _Retry(ErrorCode(code).name)
        if code in _MOVING:
            raise _Retry(ErrorCode(code).name)
        if code:
            raise error_for(code, f"ShareGroupHeartbeat for group {self.group!r}",
                            answer.error_message)
        with self._lock:
            if answer.member_id:
                self.member_id = answer.member_id
            self.epoch = answer.member_epoch
            if answer.assignment is not None:
                self._assignment = answer.assignment
        self._interval_s = max(answer.interval_ms, 100) / 1000.0
        self._joined.set()

    def _next_wait(self) -> float:
        """Seconds to the next heartbeat: ``EAGER_S`` while no partition is assigned, for up
        to ``EAGER_WINDOW_S``; else the broker's interval."""
        with self._lock:
            assigned = any(self._assignment.values())
        now = time.monotonic()
        if assigned:
            self._unassigned_since = None  # for a later rejoin, or an assignment taken away
            return self._interval_s
        if self._unassigned_since is None:
            self._unassigned_since = now
        if now - self._unassigned_since < EAGER_WINDOW_S:
            return min(EAGER_S, self._interval_s)
        return self._interval_s

    def _send(self, conn: BrokerConnection, epoch: int, topics: list[str] | None,
              deadline: float) -> consume.HeartbeatAnswer:
        version = conn.version_for(ApiKey.SHARE_GROUP_HEARTBEAT)
        body = consume.encode_heartbeat_request(version, self.group, self.member_id, epoch,
                                                topics)
        r = conn.send(ApiKey.SHARE_GROUP_HEARTBEAT, version, body, deadline)
        answer = consume.decode_heartbeat_response(version, r)
        r.expect_end("ShareGroupHeartbeat response")
        return answer

    def _coordinator(self, deadline: float) -> BrokerConnection:
        if self._conn is not None:
            return self._conn
        errors = []
        for host, port in self._bootstrap:
            try:
                conn = self._connect(host, port, deadline)
            except KafkaConnectionError as exc:
                errors.append(str(exc))
                continue
            try:
                node = _find_coordinator(conn, self.group, deadline)
            finally:
                conn.close()
            self._conn = self._connect(node.host, node.port, deadline)
            return self._conn
        raise _NoBroker(f"no bootstrap server answered: {'; '.join(errors)}")

    def _close_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # -- leaving --

    def leave(self) -> None:
        """Stop heartbeating and leave the group (epoch -1); errors are logged, not raised."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self._timeout_s)
        try:
            if self.epoch > 0 or self._conn is not None:
                deadline = time.monotonic() + min(self._timeout_s, 5.0)
                self._send(self._coordinator(deadline), -1, None, deadline)
        except KafkaShareError as exc:
            _log.info("share group %r: leaving failed (%s); the member times out", self.group,
                      exc)
        finally:
            self._close_conn()


class _Retry(BrokerError):
    """A heartbeat error that is retried (rejoin or coordinator lookup)."""


class _NoBroker(KafkaConnectionError):
    """No bootstrap server answered the coordinator lookup (all brokers down)."""


def _member_id() -> str:
    return str(uuid.uuid4())


def _find_coordinator(conn: BrokerConnection, group: str, deadline: float) -> msg.BrokerNode:
    version = conn.version_for(ApiKey.FIND_COORDINATOR)
    r = conn.send(ApiKey.FIND_COORDINATOR, version,
                  msg.encode_find_coordinator_request(version, [group]), deadline)
    found = msg.decode_find_coordinator_response(version, r)
    match = [c for c in found if c.key in (None, group)]
    if len(match) != 1:
        raise _Retry(f"FindCoordinator did not answer for group {group!r}")
    c = match[0]
    if c.error_code in _MOVING:
        raise _Retry(ErrorCode(c.error_code).name)
    if c.error_code:
        raise error_for(c.error_code, f"FindCoordinator for group {group!r}", c.error_message)
    return msg.BrokerNode(c.node_id, c.host, c.port)
