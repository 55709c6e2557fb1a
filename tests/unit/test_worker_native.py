"""The workers' native client (``client="native"``) without a broker: the seam's adapter
(``_kafka/native/adapter.py``), the lock renewer (``workers/consumer.py``) driving a scripted
native consumer through the real worker loop, the argument's checks and the group's RENEW
setting at start. The real broker's side: tests/integration/test_workers_renew.py."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import pytest

from pyspark_kafka_share._kafka.connection import ConnectionConfig
from pyspark_kafka_share._kafka.group import BrokerFacts
from pyspark_kafka_share._kafka.native.adapter import NativeMessage, NativeSession
from pyspark_kafka_share._kafka.native.consumer import NativeShareConsumer, ShareRecord
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.settings import WORKER_NAMES, ClientSettings
from pyspark_kafka_share.errors import ErrorCode, OptionError
from pyspark_kafka_share.workers import preflight
from pyspark_kafka_share.workers.config import WorkerConfig, WorkerSpec
from pyspark_kafka_share.workers.consumer import LockRenewer
from pyspark_kafka_share.workers.loop import _Worker
from pyspark_kafka_share.workers.outcome import Record
from pyspark_kafka_share.workers.settle import Poll

from .fakes import FakeNative, FakeProducer

_REQUIRED = {"bootstrap_servers": "unused:9092", "group": "g", "topics": "in"}


def _record(offset: int, *, partition: int = 0, dc: int = 1,
            headers: tuple[tuple[str, bytes | None], ...] = ()) -> ShareRecord:
    return ShareRecord("in", partition, offset, 1_700_000_000_000, b"k%d" % offset, b"v",
                       headers, dc, time.monotonic() + 30)


def _session(fake: FakeNative) -> NativeSession:
    return NativeSession(cast(NativeShareConsumer, fake))


def _spec(*, lock_ms: int, **kw: Any) -> WorkerSpec:
    base: dict[str, Any] = {
        "bootstrap_servers": "unused:9092", "group": "g", "topics": ("in",),
        "share_client": "native", "chunk_size": 2, "output_topic": None,
        "dead_letter_topic": None, "time_budget_s": 60.0, **kw}
    return WorkerSpec(WorkerConfig(**base), lock_ms=lock_ms, delivery_limit=5)


def _wait_for(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s  # only guards a hang
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# -- the adapter --------------------------------------------------------------------------------


def test_a_native_record_reads_like_a_confluent_kafka_message() -> None:
    m = NativeMessage(_record(7, partition=2, dc=3, headers=(("h", b"1"),)))
    assert (m.topic(), m.partition(), m.offset(), m.key(), m.value()) == ("in", 2, 7, b"k7", b"v")
    assert (m.headers(), m.delivery_count()) == ([("h", b"1")], 3)
    assert m.error() is None  # type: ignore[func-returns-value]
    assert m.timestamp() == (1, 1_700_000_000_000)
    appended = dataclasses.replace(m.record, log_append_time=True)
    assert NativeMessage(appended).timestamp() == (2, 1_700_000_000_000)
    assert NativeMessage(dataclasses.replace(m.record, timestamp_ms=-1)).timestamp() == (0, -1)
    assert NativeMessage(_record(1)).headers() is None  # as confluent-kafka: no headers, None


def test_settle_acknowledges_each_kind_and_reports_what_the_broker_refused() -> None:
    fake = FakeNative([[_record(0), _record(1), _record(2, partition=1)]])
    session = _session(fake)
    msgs, started = session.poll(0.1)
    assert started <= time.monotonic() and session.take_errors() == []
    settled = session.settle([msgs[0]], [msgs[1]], [msgs[2]])
    assert fake.acks == {0: "ACCEPT", 1: "RELEASE", 2: "REJECT"} and settled.ok
    assert settled.confirmed == {TopicPartition("in", 0), TopicPartition("in", 1)}

    refusing = FakeNative([[_record(5)]], renew_code=ErrorCode.INVALID_RECORD_STATE)
    (m,), _ = _session(refusing).poll(0.1)
    renewed = _session(refusing).renew([m])
    assert renewed.failed == {TopicPartition("in", 0): "INVALID_RECORD_STATE"}
    assert not renewed.confirms(m) and refusing.acks == {}  # RENEW settles nothing


# -- the renewer, through the worker loop -------------------------------------------------------


def _run_native(fake: FakeNative, lock_ms: int, fn: Callable[[Any], Any],
                records: int, chunk_size: int = 2) -> dict[str, Any]:
    session = _session(fake)
    spec = _spec(lock_ms=lock_ms, max_records=records, chunk_size=chunk_size)
    renewer = LockRenewer(session, lock_ms * spec.config.lock_safety_fraction / 1000)
    summary = _Worker(spec, fn, session=session, producer=FakeProducer(),
                      renewer=renewer).run()
    assert fake.closed
    return summary


def test_work_longer_than_the_lock_is_renewed_and_accepted() -> None:
    # A 2 s lock (budget 1 s), a poll of 2 records in chunks of 1, each call running 1.5 s
    # (past the poll's first deadline): the second chunk still starts (the renewals moved
    # the deadline; without them it would be released at the deadline), both records are
    # ACCEPTed once, renewed in each call every half budget (0.5 s), not more often.
    fake = FakeNative([[_record(0), _record(1)]])
    started = time.monotonic()

    def slow(r: Record) -> None:
        _wait_for(lambda: time.monotonic() >= started + 1.5 * (r.offset + 1), "the work")

    s = _run_native(fake, 2_000, slow, records=2, chunk_size=1)
    assert fake.acks == {0: "ACCEPT", 1: "ACCEPT"}
    assert 2 + 1 <= s["renewed"] <= 2 * 4 + 4 and s.get("renew_failures", 0) == 0
    assert s.get("released_lock_deadline", 0) == 0 and s["accepted"] == 2


def test_a_refused_renewal_is_counted_and_moves_no_deadline() -> None:
    fake = FakeNative([[_record(0)]], renew_code=ErrorCode.INVALID_RECORD_STATE)
    s = _run_native(fake, 2_000, lambda r: _wait_for(lambda: fake.renews >= 2, "renewals"),
                    records=1)
    assert s["renew_failures"] >= 2 and s.get("renewed", 0) == 0
    poll = Poll(_session(fake), Counter(), deadline=time.monotonic() + 5)
    poll.unacked = [NativeMessage(_record(0))]
    before = poll.deadline
    LockRenewer(_session(fake), 10.0).renew(poll)
    assert poll.deadline == before and poll.stats["renew_failures"] == 1


def test_the_renewal_comes_early_when_half_the_budget_is_gone() -> None:
    renewer = LockRenewer(_session(FakeNative([])), budget_s=10.0)
    now = time.monotonic()
    poll = Poll(_session(FakeNative([])), Counter(), deadline=now + 3.0)
    assert renewer.due_in(poll, last=now) == 0.0  # less than half the budget left: at once
    poll.deadline = now + 100.0
    assert 4.0 < renewer.due_in(poll, last=now) <= 5.0  # else every half budget


def test_the_renewer_stops_with_the_block() -> None:
    fake = FakeNative([])
    renewer = LockRenewer(_session(fake), budget_s=0.02)
    poll = Poll(_session(fake), Counter(), deadline=time.monotonic() + 0.02)
    poll.unacked = [NativeMessage(_record(0))]
    with renewer.covering(poll):
        _wait_for(lambda: fake.renews >= 2, "renewals")
    names = {t.name for t in threading.enumerate()}
    after = fake.renews
    assert "kafka-share-renew" not in names
    time.sleep(0.1)  # a renewer still running would renew every 10 ms meanwhile
    assert fake.renews == after


# -- the argument and the group's setting -------------------------------------------------------


def test_client_is_checked_and_native_refuses_what_it_would_ignore() -> None:
    assert WorkerConfig.create(**_REQUIRED).share_client == "librdkafka"
    assert WorkerConfig.create(**_REQUIRED, client="native").share_client == "native"
    with pytest.raises(OptionError, match=r"option 'client' = 'java'"):
        WorkerConfig.create(**_REQUIRED, client="java")
    with pytest.raises(OptionError, match=r"did you mean 'client'"):
        WorkerConfig.create(**_REQUIRED, clinet="native")
    for key, value in (("socket.keepalive.enable", "true"), ("statistics.interval.ms", "0")):
        with pytest.raises(OptionError, match=rf"consumer_config\['{key}'\].*client='librdkafka'"):
            WorkerConfig.create(**_REQUIRED, client="native", consumer_config={key: value})
        WorkerConfig.create(**_REQUIRED, consumer_config={key: value})  # librdkafka takes it
    honoured = {"fetch.wait.max.ms": "100", "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p",
                "enable.ssl.certificate.verification": "false"}
    WorkerConfig.create(**_REQUIRED, client="native", consumer_config=honoured)


def test_every_setting_a_connection_config_gives_is_one_the_native_client_honours() -> None:
    # connection=ConnectionConfig(...) joins consumer_config as librdkafka keys: each must be
    # one the native client reads, or client="native" would refuse the workers' own setting.
    oidc = {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
            "sasl.oauthbearer.method": "oidc", "sasl.oauthbearer.client.id": "c",
            "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
            "sasl.oauthbearer.client.secret": "s", "sasl.oauthbearer.scope": "x",
            "sasl.oauthbearer.extensions": "a=b", "ssl.ca.location": "/ca.pem",
            "ssl.certificate.location": "/c.pem", "ssl.key.location": "/k.pem",
            "ssl.key.password": "p", "ssl.endpoint.identification.algorithm": "none",
            "enable.ssl.certificate.verification": "false"}
    scram = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "SCRAM-SHA-512",
             "sasl.username": "u", "sasl.password": "p"}
    for settings in (oidc, scram):
        connection = ConnectionConfig.from_client_settings(settings)
        assert set(connection.client_settings()) == set(settings) - {"sasl.mechanisms"} | (
            {"sasl.mechanism"} if "sasl.mechanisms" in settings else set())
        # (joined as WorkerConfig.create joins them; its librdkafka check is left out: on this
        # made-up TLS/OIDC configuration it aborted the test process)
        client = ClientSettings("h:9092", "g", tuple(connection.client_settings().items()),
                                names=WORKER_NAMES)
        assert client.native_consumer(client_id="w").connection == connection


@pytest.mark.parametrize(("enabled", "sets"), [(False, True), (True, False), (None, False)])
def test_the_group_is_made_to_allow_renew_only_where_it_is_off(
        monkeypatch: pytest.MonkeyPatch, enabled: bool | None, sets: bool) -> None:
    calls: list[tuple[dict[str, str], str]] = []
    monkeypatch.setattr(preflight, "set_group_configs",
                        lambda settings, configs, *, option: calls.append((configs, option)))
    config = WorkerConfig.create(**_REQUIRED, client="native")
    preflight.allow_renew(config, BrokerFacts({"in": 1}, 30_000, 5, renew_enabled=enabled))
    assert calls == ([({"share.renew.acknowledge.enable": "true"}, "client")] if sets else [])
