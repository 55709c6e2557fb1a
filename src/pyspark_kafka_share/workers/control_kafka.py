"""The control channel over Kafka: for drivers the tasks cannot reach (Spark Connect clients).

A Spark Connect client has no SparkContext and no port the executors can reach, but the client
and the tasks both reach the Kafka cluster, so the channel of :mod:`.control` travels through a
small **control topic** there (``control_topic``; default ``kafka-share-control.<group>``, one
per share group, shared by that group's jobs over time):

- **Layout:** partition 0 carries the driver's messages to the workers, partition 1 the
  workers' to the driver (a topic with a single partition, made by hand, carries both). Each
  side reads its partition with a plain ``assign()`` from the end offset it saw at its start:
  no consumer group joins, nothing is committed, old messages are never read. The driver
  creates the topic when it is missing (2 partitions, ``retention.ms`` 1 hour,
  ``segment.ms`` 10 min: control messages are useless after seconds).
- **Who:** a message is JSON ``{"p": payload, "sig": HMAC-SHA256(job secret, payload)}``, keyed
  by the job id. The per-job secret travels only inside the task spec (as on TCP); messages of
  other jobs are skipped, a message of this job with a wrong signature is refused and counted.
  A principal that may write the topic can therefore fill it, but cannot forge a stop, a report
  or a lease.
- **What:** the driver stays the arbiter (the same :class:`~.control.ControlState` as on TCP):
  workers send their counters every ``interval`` seconds and lease requests; the driver sends
  its state (the stop flag) every :data:`HEARTBEAT_S` and at once on a stop, and answers each
  lease request, addressed to the asking attempt. A worker that heard the driver once and then
  hears nothing for ``_LOST_AFTER_S`` (15 s), or hears it close, stops; a worker that never hears
  it within :data:`FIRST_CONTACT_S` runs on its local stop conditions, as on TCP.

Latency: a report or a stop takes one produce and one fetch (``fetch.wait.max.ms`` 100 ms here):
tens of milliseconds on a healthy cluster, against under a millisecond on TCP. The lease
expiry (:data:`~.control.LEASE_EXPIRY_S`, 10 s) is judged on the driver's clock, as on TCP.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pyspark_kafka_share._kafka.logs import client_config
from pyspark_kafka_share._kafka.settings import CONNECTION_PREFIXES, ClientSettings
from pyspark_kafka_share.errors import ErrorCode, OptionError, from_client_error
from pyspark_kafka_share.workers import control as _control
from pyspark_kafka_share.workers.control import ControlState

__all__ = [
    "CONTROL_TOPIC_CONFIG",
    "CONTROL_TOPIC_PREFIX",
    "FIRST_CONTACT_S",
    "HEARTBEAT_S",
    "KafkaControlClient",
    "KafkaControlServer",
    "KafkaEndpoint",
    "control_topic_name",
    "ensure_control_topic",
]

_log = logging.getLogger("pyspark_kafka_share.workers")

CONTROL_TOPIC_PREFIX = "kafka-share-control."
CONTROL_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": "3600000",
                        "segment.ms": "600000"}
"""A control topic the driver creates: its messages matter for seconds."""
HEARTBEAT_S = 0.5
"""How often the driver publishes its state (the stop flag): also its sign of life."""
FIRST_CONTACT_S = 15.0
"""A worker that has not heard the driver this long after its start runs on its own."""
_DRIVER, _WORKER = "driver", "worker"
_FLUSH_S = 5.0


@dataclass(frozen=True)
class KafkaEndpoint:
    """Where a job's control messages travel, pickled into the task spec."""

    topic: str
    client: ClientSettings = field(repr=False)
    job_id: str
    secret: str = field(repr=False)
    to_workers: int = 0
    to_driver: int = 1


def control_topic_name(group: str) -> str:
    """The default control topic of share group ``group``: ``kafka-share-control.<group>``,
    with a hash of the group's name when the name has characters a topic cannot have."""
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", group)
    if slug == group and len(CONTROL_TOPIC_PREFIX + slug) <= 200:
        return CONTROL_TOPIC_PREFIX + slug
    digest = hashlib.sha256(group.encode()).hexdigest()[:10]
    return f"{CONTROL_TOPIC_PREFIX}{slug[:180]}-{digest}"


# ---- messages ------------------------------------------------------------------------------

def _seal(endpoint: KafkaEndpoint, sender: str, body: dict[str, Any]) -> bytes:
    payload = json.dumps({"job": endpoint.job_id, "from": sender, "body": body},
                         sort_keys=True, separators=(",", ":"))
    sig = hmac.new(endpoint.secret.encode(), payload.encode(), hashlib.sha256).hexdigest()
    return json.dumps({"p": payload, "sig": sig}).encode()


class _Forged(Exception):
    """A message under this job's key whose signature is not the job's."""


def _unseal(endpoint: KafkaEndpoint, sender: str, key: bytes | None,
            raw: bytes | None) -> dict[str, Any] | None:
    """The body of a message of this job from ``sender``; None when it is not one (another
    job's, or the other direction's). Raises :class:`_Forged` when it claims to be this job's
    but is not signed with its secret."""
    if key != endpoint.job_id.encode() or not raw:
        return None
    try:
        outer = json.loads(raw)
        payload, sig = str(outer["p"]), str(outer["sig"])
    except (ValueError, KeyError, TypeError):
        raise _Forged from None
    expected = hmac.new(endpoint.secret.encode(), payload.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(sig, expected):
        raise _Forged
    inner = json.loads(payload)  # signed by us: JSON of a dict
    if inner.get("job") != endpoint.job_id or inner.get("from") != sender:
        return None
    body = inner.get("body")
    return body if isinstance(body, dict) else None


# ---- clients -------------------------------------------------------------------------------

def _producer(client: ClientSettings) -> Any:
    from confluent_kafka import Producer

    # One message at a time, sent at once: control messages are few and latency matters.
    return Producer(client.producer({"linger.ms": 0}))


def _consumer(client: ClientSettings, endpoint_topic: str, partition: int, who: str) -> Any:
    """A consumer of one partition of the control topic from its current end.

    ``group.id`` is the share group's (librdkafka wants one): the consumer only ``assign()``s
    and never commits, so it joins nothing, and looking up the group's coordinator needs no
    ACL beyond the share group's READ the workers hold anyway."""
    from confluent_kafka import Consumer, TopicPartition

    conf: dict[str, Any] = {k: v for k, v in client.extra if k.startswith(CONNECTION_PREFIXES)}
    if client.token_provider is not None:
        conf["oauth_cb"] = client.token_provider
    conf.update({"bootstrap.servers": client.bootstrap_servers, "group.id": client.group_id,
                 "client.id": f"kafka-share-control-{who}", "enable.auto.commit": False,
                 "enable.auto.offset.store": False, "fetch.wait.max.ms": 100,
                 "socket.timeout.ms": int(client.timeout_s * 1000)})
    consumer = Consumer(client_config(conf))
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(endpoint_topic, partition),
                                                    timeout=min(client.timeout_s, 10.0))
        consumer.assign([TopicPartition(endpoint_topic, partition, high)])
    except BaseException:
        consumer.close()
        raise
    return consumer


def ensure_control_topic(client: ClientSettings, topic: str, option: str) -> int:
    """Create the control topic if it is missing; its partition count (1 or more).

    Raises :class:`OptionError` / :class:`AuthorizationError` naming ``option`` and the fix
    when it cannot be listed or created."""
    from confluent_kafka import KafkaException

    from pyspark_kafka_share._kafka.access import authorization_error
    from pyspark_kafka_share._kafka.group import admin_client

    admin = admin_client(client)
    timeout = client.timeout_s
    deadline = time.monotonic() + timeout
    tried: str | None = None  # what creating it answered: "created" or "exists"
    tried_at = 0.0
    while True:
        try:
            md = admin.list_topics(timeout=max(1.0, deadline - time.monotonic()))
        except KafkaException as exc:
            raise from_client_error(exc, f"cannot list the topics on {client.bootstrap_servers} "
                                    f"to find the workers' control topic {topic!r}") from exc
        found = md.topics.get(topic)
        if found is not None and found.error is None and found.partitions and \
                all(p.leader >= 0 for p in found.partitions.values()):
            return len(found.partitions)
        if (found is not None and found.error is not None and
                found.error.code() == ErrorCode.TOPIC_AUTHORIZATION_FAILED) or \
                (found is None and tried == "exists" and time.monotonic() - tried_at > 3):
            # A topic this principal may not DESCRIBE is left out of the listing.
            raise authorization_error(
                client, "topic", topic, ("Read", "Write"),
                f"the workers' control topic ({option})",
                code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        if time.monotonic() > deadline:
            raise OptionError(option, topic, f"the control topic has no leader for all its "
                              f"partitions after {timeout:.0f}s; check the brokers")
        if found is None and tried is None:
            tried, tried_at = _create(admin, client, topic, option), time.monotonic()
        time.sleep(0.2)


def _create(admin: Any, client: ClientSettings, topic: str, option: str) -> str:
    """Create the control topic: "created", or "exists" when someone else has."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    from pyspark_kafka_share._kafka.access import authorization_error

    future = admin.create_topics([NewTopic(topic, num_partitions=2,
                                           config=dict(CONTROL_TOPIC_CONFIG))],
                                 request_timeout=client.timeout_s)[topic]
    try:
        future.result(timeout=client.timeout_s + 5)
    except KafkaException as exc:
        code = exc.args[0].code() if exc.args and hasattr(exc.args[0], "code") else None
        if code == KafkaError.TOPIC_ALREADY_EXISTS:
            return "exists"
        if code in (KafkaError.TOPIC_AUTHORIZATION_FAILED,
                    KafkaError.CLUSTER_AUTHORIZATION_FAILED):
            raise authorization_error(
                client, "topic", topic, ("Create",),
                f"creating the workers' control topic ({option}; or create it beforehand "
                "with 2 partitions and retention.ms=3600000)",
                code=ErrorCode.TOPIC_AUTHORIZATION_FAILED) from None
        raise from_client_error(exc, f"cannot create the workers' control topic {topic!r}",
                                f"Create it beforehand (2 partitions), or name another with "
                                f"{option}") from exc
    _log.info("kafka-share workers: created the control topic %r", topic)
    return "created"


# ---- the driver's side ---------------------------------------------------------------------

class KafkaControlServer(ControlState):
    """The Kafka transport's driver side: reads the workers' partition, answers lease requests,
    publishes the stop flag every :data:`HEARTBEAT_S` (and at once on a stop).

    Build it with :meth:`open`; tests pass their own ``producer`` and ``consumer``."""

    def __init__(self, endpoint: KafkaEndpoint, *, producer: Any, consumer: Any,
                 on_report: Callable[[dict[str, Any]], None] | None = None) -> None:
        super().__init__(on_report)
        self.endpoint = endpoint
        self._producer = producer
        self._consumer = consumer
        self._closed = threading.Event()
        self._wake = threading.Event()
        self._send_lock = threading.Lock()
        self.failures = 0  # control messages the broker did not take
        self._thread = threading.Thread(target=self._serve, daemon=True,
                                        name="kafka-share-workers-control")
        self._thread.start()

    @classmethod
    def open(cls, client: ClientSettings, topic: str, job_id: str, *,
             option: str = "control_topic") -> KafkaControlServer:
        """Check (or create) the control topic, then reach it: a first message is written to
        and read back from the driver's own partition, so a missing CREATE, READ or WRITE
        fails here, before any task starts."""
        partitions = ensure_control_topic(client, topic, option)
        endpoint = KafkaEndpoint(topic, client, job_id, secrets.token_hex(32),
                                 to_workers=0, to_driver=1 if partitions > 1 else 0)
        try:
            producer = _producer(client)
            consumer = _consumer(client, topic, endpoint.to_driver, "driver")
        except Exception as exc:
            raise from_client_error(exc, f"cannot read the workers' control topic {topic!r}",
                                    f"Check the ACLs: READ and WRITE on it ({option})") from exc
        _probe(endpoint, producer, consumer, option)
        return cls(endpoint, producer=producer, consumer=consumer)

    def request_stop(self, reason: str) -> None:
        super().request_stop(reason)
        self._wake.set()

    def _state(self, closed: bool = False) -> dict[str, Any]:
        return {"state": {"stop": self.stopping, "reason": self.stop_reason, "closed": closed}}

    def _send(self, body: dict[str, Any]) -> None:
        e = self.endpoint

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                self.failures += 1
                if self.failures == 1:
                    _log.warning("kafka-share workers: a control message to %r failed: %s",
                                 e.topic, err)

        with self._send_lock, contextlib.suppress(Exception):
            self._producer.produce(e.topic, value=_seal(e, _DRIVER, body),
                                   key=e.job_id.encode(), partition=e.to_workers,
                                   on_delivery=delivered)
            self._producer.poll(0)

    def _serve(self) -> None:
        next_beat = 0.0
        while not self._closed.is_set():
            now = time.monotonic()
            if now >= next_beat or self._wake.is_set():
                self._wake.clear()
                self._send(self._state())
                next_beat = now + HEARTBEAT_S
            try:
                msg = self._consumer.poll(0.1)
            except Exception:  # noqa: BLE001 - a closed or broken consumer: keep beating
                time.sleep(0.1)
                continue
            if msg is None or msg.error() is not None:
                continue
            self._handle(msg.key(), msg.value())

    def _handle(self, key: bytes | None, raw: bytes | None) -> None:
        try:
            body = _unseal(self.endpoint, _WORKER, key, raw)
        except _Forged:
            with self._lock:
                self.refusals += 1
            if self.refusals == 1:
                _log.warning("kafka-share workers: refused a control message on %r: it is not "
                             "signed with the job's secret", self.endpoint.topic)
            return
        if body is None:
            return
        try:
            reply = self.answer(body)
        except (TypeError, ValueError):
            return
        lease = body.get("lease")
        if isinstance(lease, dict):
            self._send({"lease": {**reply, "worker": lease.get("worker"),
                                  "attempt": lease.get("attempt"), "to": lease.get("from")}})

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join(5)
        self._send(self._state(closed=True))  # workers still running stop at once
        with contextlib.suppress(Exception):
            self._producer.flush(_FLUSH_S)
        with contextlib.suppress(Exception):
            self._consumer.close()


def _probe(endpoint: KafkaEndpoint, producer: Any, consumer: Any, option: str) -> None:
    """Write a message to the driver's own partition and read it back."""
    from confluent_kafka import KafkaError

    from pyspark_kafka_share._kafka.access import authorization_error

    client = endpoint.client
    errors: list[Any] = []

    def fail(operation: str, err: Any) -> None:
        with contextlib.suppress(Exception):
            consumer.close()
        if err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            raise authorization_error(client, "topic", endpoint.topic, (operation,),
                                      f"the workers' control topic ({option})",
                                      code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
        raise OptionError(option, endpoint.topic, f"cannot {operation.lower()} the control "
                          f"topic ({err or 'no answer'} within {client.timeout_s:.0f}s); "
                          "check the brokers and the ACLs (READ and WRITE on it)")

    probe = secrets.token_hex(8)
    producer.produce(endpoint.topic, value=_seal(endpoint, _DRIVER, {"probe": probe}),
                     key=endpoint.job_id.encode(), partition=endpoint.to_driver,
                     on_delivery=lambda err, _m: errors.append(err))
    producer.flush(client.timeout_s)
    if not errors or errors[0] is not None:
        fail("Write", errors[0] if errors else None)
    deadline = time.monotonic() + client.timeout_s
    while time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if msg.error() is not None:
            if msg.error().code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                fail("Read", msg.error())
            continue
        with contextlib.suppress(_Forged):
            body = _unseal(endpoint, _DRIVER, msg.key(), msg.value())
            if body is not None and body.get("probe") == probe:
                return
    fail("Read", None)


# ---- the worker's side ---------------------------------------------------------------------

class KafkaControlClient:
    """The Kafka transport's worker side (a :class:`~.control.WorkerChannel`). Never raises:
    a control topic it cannot reach leaves the worker on its local stop conditions, as an
    unreachable driver does on TCP."""

    def __init__(self, endpoint: KafkaEndpoint, interval_s: float, *,
                 producer: Any = None, consumer: Any = None) -> None:
        self.endpoint = endpoint
        self.interval_s = interval_s
        self.id = secrets.token_hex(8)  # lease replies are addressed to this client
        self.stop = False
        self.lost = False
        self.ever_connected = False
        self.refusals = 0
        self._started = time.monotonic()
        self._heard = 0.0
        self._replies: dict[tuple[int, int], dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._closed = threading.Event()
        self._reporter: threading.Thread | None = None
        self._consumer_closed = False
        self._producer = producer
        self._consumer = consumer
        try:
            if self._producer is None:
                self._producer = _producer(endpoint.client)
            if self._consumer is None:
                self._consumer = _consumer(endpoint.client, endpoint.topic,
                                           endpoint.to_workers, "worker")
        except Exception as exc:  # noqa: BLE001 - no channel: the worker runs on its own
            _log.warning("kafka-share workers: cannot reach the control topic %r (%s); this "
                         "worker runs on its local stop conditions", endpoint.topic, exc)
            self._consumer = None
        self._listener = threading.Thread(target=self._listen, daemon=True,
                                          name="kafka-share-worker-control")
        if self._consumer is not None:
            self._listener.start()

    # ---- receiving ---------------------------------------------------------------------------

    def _listen(self) -> None:
        while not self._closed.is_set():
            try:
                msg = self._consumer.poll(0.2)
            except Exception:  # noqa: BLE001 - closed under us
                return
            if msg is not None and msg.error() is None:
                self._handle(msg.key(), msg.value())
            if self.ever_connected and not self.lost and \
                    time.monotonic() - self._heard > _control._LOST_AFTER_S:
                self._lose()

    def _lose(self) -> None:
        with self._cond:
            self.lost = True
            self.stop = True
            self._cond.notify_all()

    def _handle(self, key: bytes | None, raw: bytes | None) -> None:
        try:
            body = _unseal(self.endpoint, _DRIVER, key, raw)
        except _Forged:
            self.refusals += 1
            return
        if body is None:
            return
        with self._cond:
            self._heard = time.monotonic()
            self.ever_connected = True
            state = body.get("state")
            if isinstance(state, dict):
                self.stop = self.stop or bool(state.get("stop"))
                if state.get("closed"):
                    self.lost = True
                    self.stop = True
            lease = body.get("lease")
            if isinstance(lease, dict) and lease.get("to") == self.id:
                self.stop = self.stop or bool(lease.get("stop"))
                key2 = (int(lease.get("worker", -1)), int(lease.get("attempt", -1)))
                self._replies[key2] = lease
            self._cond.notify_all()

    # ---- sending -----------------------------------------------------------------------------

    def _send(self, body: dict[str, Any]) -> None:
        if self._producer is None:
            return
        e = self.endpoint
        with contextlib.suppress(Exception):  # best effort: the next report follows
            self._producer.produce(e.topic, value=_seal(e, _WORKER, body),
                                   key=e.job_id.encode(), partition=e.to_driver)
            self._producer.poll(0)

    def acquire_lease(self, worker: int, attempt: int, *,
                      should_quit: Callable[[], bool] = lambda: False) -> bool:
        """Wait for the lease of ``worker``; False: this attempt must not run (the holder
        finished, or the driver stops the job). True at once without a control topic, and
        after :data:`FIRST_CONTACT_S` without a word from the driver."""
        if self._consumer is None:
            return True
        key = (worker, attempt)
        while not should_quit():
            with self._cond:
                self._replies.pop(key, None)
            self._send({"lease": {"worker": worker, "attempt": attempt, "from": self.id}})
            with self._cond:
                self._cond.wait_for(lambda: key in self._replies or self.lost, timeout=1.0)
                reply = self._replies.pop(key, None)
                lost, heard = self.lost, self.ever_connected
            if lost:
                return False
            if reply is None:
                if not heard and time.monotonic() - self._started > FIRST_CONTACT_S:
                    _log.warning("kafka-share workers: no word from the driver on %r within "
                                 "%.0fs; this worker runs on its local stop conditions",
                                 self.endpoint.topic, FIRST_CONTACT_S)
                    return True
                continue
            if reply.get("granted"):
                return True
            if reply.get("done"):
                return False
            time.sleep(min(1.0, _control.LEASE_EXPIRY_S / 4))
        return False

    def start(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        """Report ``snapshot()`` every ``interval_s`` from a daemon thread until :meth:`close`."""
        if self._producer is None:
            return
        self._reporter = _control.start_reporter(self._closed, self.interval_s, snapshot,
                                                 self.report)

    def report(self, report: dict[str, Any]) -> bool:
        """Send ``report`` now; True = stop."""
        self._send({"report": report})
        return self.stop

    def close(self) -> None:
        """Stop reporting and listening; what was sent is flushed (also on a second call,
        after the worker's final report)."""
        self._closed.set()
        for thread in (self._reporter, self._listener):
            if thread is not None and thread.is_alive() and \
                    thread is not threading.current_thread():
                thread.join(10)
        if self._consumer is not None and not self._consumer_closed:
            self._consumer_closed = True
            with contextlib.suppress(Exception):
                self._consumer.close()
        if self._producer is not None:
            with contextlib.suppress(Exception):
                self._producer.flush(_FLUSH_S)
