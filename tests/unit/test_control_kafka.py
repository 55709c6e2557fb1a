"""The queue workers' Kafka control channel (``workers/control_kafka.py``) over an in-memory
topic: progress, the stop, the per-worker lease and its expiry, signatures, a silent or closed
driver (no broker; the real channel runs in tests/connect and tests/integration)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share._kafka.topics import topic_prefix
from pyspark_kafka_share.workers import control_kafka as _ck
from pyspark_kafka_share.workers import control_state
from pyspark_kafka_share.workers.control_kafka import (
    KafkaControlClient,
    KafkaControlServer,
    KafkaEndpoint,
    control_topic_name,
)


class _Msg:
    def __init__(self, key: bytes | None, value: bytes | None) -> None:
        self._key, self._value = key, value

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> None:
        return None


class Topic:
    """An in-memory topic: one list of (key, value) per partition."""

    def __init__(self, partitions: int = 2) -> None:
        self.logs: list[list[tuple[bytes | None, bytes | None]]] = \
            [[] for _ in range(partitions)]
        self.cond = threading.Condition()
        self.down = False  # the broker takes nothing

    def producer(self) -> Producer:
        return Producer(self)

    def consumer(self, partition: int) -> Consumer:
        return Consumer(self, partition)


class Producer:
    def __init__(self, topic: Topic) -> None:
        self.topic = topic

    def produce(self, _name: str, value: bytes | None = None, key: bytes | None = None,
                partition: int = 0, on_delivery: Callable[[Any, Any], None] | None = None) \
            -> None:
        with self.topic.cond:
            if not self.topic.down:
                self.topic.logs[partition].append((key, value))
                self.topic.cond.notify_all()
        if on_delivery is not None:
            on_delivery("down" if self.topic.down else None, None)

    def poll(self, _timeout: float = 0) -> int:
        return 0

    def flush(self, _timeout: float = 0) -> int:
        return 0


class Consumer:
    """Reads one partition from its end at creation."""

    def __init__(self, topic: Topic, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self.position = len(topic.logs[partition])
        self.closed = False

    def poll(self, timeout: float) -> _Msg | None:
        log = self.topic.logs[self.partition]
        with self.topic.cond:
            self.topic.cond.wait_for(lambda: self.position < len(log), timeout)
            if self.position >= len(log):
                return None
            key, value = log[self.position]
            self.position += 1
        return _Msg(key, value)

    def close(self) -> None:
        self.closed = True


def _endpoint(topic: Topic, job: str = "job1", secret: str = "s" * 64) -> KafkaEndpoint:
    single = len(topic.logs) == 1
    return KafkaEndpoint("ctl", ClientSettings("unused:9092", "g"), job, secret,
                         to_workers=0, to_driver=0 if single else 1)


def _server(topic: Topic, endpoint: KafkaEndpoint | None = None) -> KafkaControlServer:
    e = endpoint or _endpoint(topic)
    return KafkaControlServer(e, producer=topic.producer(), consumer=topic.consumer(e.to_driver))


def _client(topic: Topic, endpoint: KafkaEndpoint | None = None,
            interval_s: float = 0.05) -> KafkaControlClient:
    e = endpoint or _endpoint(topic)
    return KafkaControlClient(e, interval_s, producer=topic.producer(),
                              consumer=topic.consumer(e.to_workers))


def _until(cond: Callable[[], object], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


@pytest.mark.parametrize("partitions", [2, 1])
def test_progress_and_the_stop_travel_both_ways(partitions: int) -> None:
    """Reports reach the driver's state; the driver's stop reaches the worker (also on a
    hand-made topic with one partition, which carries both directions)."""
    topic = Topic(partitions)
    seen: list[dict[str, Any]] = []
    server = _server(topic)
    server._on_report = seen.append
    client = _client(topic)
    try:
        _until(lambda: client.ever_connected)  # the driver's heartbeat
        assert client.report({"worker": 0, "attempt": 0, "processed": 3}) is False
        _until(lambda: server.latest().get(0, {}).get("processed") == 3)
        client.start(lambda: {"worker": 0, "attempt": 0, "processed": 7})
        _until(lambda: server.latest()[0]["processed"] == 7)
        server.request_stop("time budget")
        server.request_stop("later reasons do not overwrite the first")
        _until(lambda: client.stop)
        assert client.report({"worker": 0, "attempt": 0}) is True
        assert server.stop_reason == "time budget" and not client.lost
    finally:
        client.close()
        server.close()
    assert seen and all(r["worker"] == 0 for r in seen)


def test_one_attempt_per_worker_holds_the_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """A speculative copy waits while the holder reports, takes over when the holder goes
    silent for LEASE_EXPIRY_S, and a copy of a finished worker ends without running."""
    monkeypatch.setattr(control_state, "LEASE_EXPIRY_S", 0.5)
    topic = Topic()
    server = _server(topic)
    holder, copy, late = _client(topic), _client(topic), _client(topic)
    try:
        assert holder.acquire_lease(0, 0) is True
        holder.start(lambda: {"worker": 0, "attempt": 0, "state": "running"})
        got: list[bool] = []
        waiting = threading.Thread(target=lambda: got.append(copy.acquire_lease(0, 1)))
        waiting.start()
        time.sleep(1.5)  # three expiry periods: the holder keeps reporting
        assert got == [] and server.reports()[(0, 0)]["state"] == "running"
        assert _client(topic).acquire_lease(1, 0) is True  # other workers are independent
        holder.close()  # the holder's executor dies: it goes silent
        waiting.join(5)
        assert got == [True], "the copy did not take over the silent holder's lease"
        server.update({"worker": 0, "attempt": 1, "state": "stopped"})
        assert late.acquire_lease(0, 2) is False  # the holder finished: do not run
        server.request_stop("interrupted")
        assert late.acquire_lease(3, 0) is False
    finally:
        for c in (holder, copy, late):
            c.close()
        server.close()


def test_messages_not_signed_with_the_jobs_secret_are_refused() -> None:
    """A principal that may write the control topic cannot forge a report, a lease or a stop;
    another job's messages on the same topic are skipped."""
    topic = Topic()
    real = _endpoint(topic)
    server = _server(topic, real)
    client = _client(topic, real)
    forged = _endpoint(topic, secret="wrong")
    other_job = _endpoint(topic, job="job2", secret="other")
    try:
        _until(lambda: client.ever_connected)
        for e in (forged, other_job):
            topic.producer().produce("ctl", _ck._seal(e, "worker", {"report": {
                "worker": 0, "attempt": 0, "processed": 99}}), e.job_id.encode(),
                partition=e.to_driver)
            topic.producer().produce("ctl", _ck._seal(e, "driver", {"state": {"stop": True}}),
                                     e.job_id.encode(), partition=e.to_workers)
        topic.producer().produce("ctl", b"not json", real.job_id.encode(), partition=1)
        _until(lambda: server.refusals == 2 and client.refusals == 1)
        time.sleep(0.3)
        assert server.reports() == {} and not client.stop and not server.stopping
    finally:
        client.close()
        server.close()
    assert "s" * 64 not in repr(real) and "client" not in repr(real)


def test_a_worker_that_never_hears_the_driver_runs_on_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_ck, "FIRST_CONTACT_S", 0.3)
    topic = Topic()
    client = _client(topic)  # no driver on the topic
    try:
        started = time.monotonic()
        assert client.acquire_lease(0, 0) is True
        # It waits FIRST_CONTACT_S (0.3 s here, 15 s by default) for the driver: 10 s (was 3 s)
        # holds on a loaded 2-core machine and still fails a wait of the default.
        assert time.monotonic() - started < 10
        assert client.report({"worker": 0}) is False
        assert not client.ever_connected and not client.lost  # local stop conditions apply
    finally:
        client.close()


def test_a_driver_that_goes_silent_or_closes_stops_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(control_state, "LOST_AFTER_S", 0.3)
    topic = Topic()
    server = _server(topic)
    client = _client(topic)
    try:
        _until(lambda: client.ever_connected)
        topic.down = True  # the driver's heartbeats no longer arrive
        _until(lambda: client.stop)
        assert client.lost
    finally:
        client.close()
        server.close()
    topic = Topic()
    server = _server(topic)
    client = _client(topic)
    try:
        _until(lambda: client.ever_connected)
        server.close()  # the job ended: a worker still running stops at once
        _until(lambda: client.stop, timeout_s=1.0)
        assert client.lost
        assert client.acquire_lease(0, 0) is False
    finally:
        client.close()


def test_a_worker_without_a_reachable_control_topic_runs_on_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def unreachable(*_args: Any) -> Any:
        raise RuntimeError("no broker")

    monkeypatch.setattr(_ck, "_consumer", unreachable)
    topic = Topic()
    client = KafkaControlClient(_endpoint(topic), 0.05, producer=topic.producer())
    assert client.acquire_lease(0, 0) is True
    assert client.report({"worker": 0}) is False
    client.close()


def test_control_topic_names() -> None:
    assert control_topic_name("scorers") == "kafka-share-control.scorers"
    odd = control_topic_name("team a/scorers")
    assert odd.startswith(topic_prefix("control") + "team_a_scorers-") and odd != \
        control_topic_name("team_a/scorers")
    assert len(control_topic_name("g" * 300)) <= 249


def test_a_connect_server_without_the_package_is_a_setup_error() -> None:
    """A Connect client cannot check the server's Python beforehand: the job's failure to
    unpickle the worker task there is re-raised as a SetupError naming the fix."""
    from pyspark_kafka_share.errors import SetupError
    from pyspark_kafka_share.workers.preflight import explained

    failure = RuntimeError("PythonException: ... ModuleNotFoundError: No module named "
                           "'pyspark_kafka_share'")
    error = explained(failure)
    assert isinstance(error, SetupError) and error.__cause__ is failure
    assert "pip install pyspark-kafka-share" in str(error)
    other = ValueError("something else")
    assert explained(other) is other


class _RefusingProducer:
    """A producer whose local queue is full (``BufferError``) or that the broker refuses
    (a failed delivery), as the test sets ``mode``."""

    def __init__(self) -> None:
        self.mode = "full"
        self.sent = 0

    def produce(self, _name: str, value: bytes | None = None, key: bytes | None = None,
                partition: int = 0, on_delivery: Callable[[Any, Any], None] | None = None) \
            -> None:
        if self.mode == "full":
            raise BufferError("Local: Queue full")
        self.sent += 1
        if on_delivery is not None:
            on_delivery("Broker: Not enough in-sync replicas", None)

    def poll(self, _timeout: float = 0) -> int:
        return 0

    def flush(self, _timeout: float = 0) -> int:
        return 0


def test_control_messages_that_fail_are_counted_and_logged_once_a_minute(
        caplog: pytest.LogCaptureFixture) -> None:
    """The driver's sends (the heartbeat, the stop, lease answers) and a worker's reports:
    a full queue raised at produce() and a refused delivery are both counted; the first is
    logged at once, later ones at most once a minute with the count meanwhile."""
    topic = Topic()
    e = _endpoint(topic)
    producer = _RefusingProducer()
    with caplog.at_level("WARNING", logger="pyspark_kafka_share.workers"):
        server = KafkaControlServer(e, producer=producer, consumer=topic.consumer(e.to_driver))
        try:
            _until(lambda: server.failures.count >= 3)  # heartbeats every HEARTBEAT_S
            producer.mode = "refused"
            server.request_stop("done")
            _until(lambda: producer.sent >= 1 and server.failures.count >= 4)
        finally:
            server.close()
        lines = [r.getMessage() for r in caplog.records if "control message" in r.getMessage()]
        assert len(lines) == 1, lines  # rate-limited: one line within the minute
        assert "from the driver" in lines[0] and "BufferError: Local: Queue full" in lines[0]
        server.failures._logged_at = -1e9  # a minute later: the next failure is logged
        server.failures.record("Broker: Not enough in-sync replicas")
        lines = [r.getMessage() for r in caplog.records if "control message" in r.getMessage()]
        assert len(lines) == 2 and "in-sync replicas" in lines[1], lines
        count = server.failures.count
        assert f"({count} in all" in lines[1]

    client = KafkaControlClient(e, 0.05, producer=producer, consumer=topic.consumer(0))
    try:
        assert client.report({"worker": 0}) is False
        assert client.failures.count == 1  # the worker's report, refused on delivery
    finally:
        client.close()
