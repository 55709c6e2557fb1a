"""The protocol client and confluent-kafka against a secured broker (TLS, SASL, ACLs).

One broker for the file: a ``SASL_SSL`` listener (PLAIN, SCRAM-SHA-256/512, OAUTHBEARER) and
an ``SSL`` listener that requires client certificates, ``StandardAuthorizer`` on, and a short
``connections.max.reauth.ms`` so that re-authentication (KIP-368) is exercised. Every
misconfiguration must fail with its cause named within 5 s.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from pyspark_kafka_share._kafka.connection import ConnectionConfig
from pyspark_kafka_share._kafka.protocol.client import KafkaProtocolClient
from pyspark_kafka_share.errors import (
    AuthenticationError,
    AuthorizationError,
    GroupNotFoundError,
    KafkaShareError,
    OptionError,
    SecurityProtocolMismatchError,
    TlsError,
)
from pyspark_kafka_share.harness import LocalKafka
from tests.helpers import fails_within

pytestmark = pytest.mark.broker

ALICE, ALICE_PW = "alice", "alice-pw-Zq9"
BOB, BOB_PW = "bob", "bob-pw-Xy7"
FAIL_WITHIN_S = 5.0
REAUTH_MS = 3_000


@pytest.fixture(scope="module")
def kafka() -> Iterator[LocalKafka]:
    broker = LocalKafka(security="sasl_ssl,ssl,sasl_plaintext", users={ALICE: ALICE_PW},
                        heap="512m", extra_config={"connections.max.reauth.ms": str(REAUTH_MS)})
    with broker:
        broker.add_user(BOB, BOB_PW)
        yield broker


def _client(kafka: LocalKafka, config: ConnectionConfig, bootstrap: str | None = None,
            timeout_s: float = 30.0) -> KafkaProtocolClient:
    return KafkaProtocolClient(bootstrap or kafka.secured.bootstrap(config.security_protocol
                                                                     .lower()),
                               connection=config, timeout_s=timeout_s)


def _fails_fast(call: Callable[[], object], error: type[Exception], match: str) -> str:
    """Run ``call``; it must raise ``error`` matching ``match`` within FAIL_WITHIN_S."""
    return fails_within(call, error, match, FAIL_WITHIN_S)


# -- the protocol client, each way in -------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN", "OAUTHBEARER"])
def test_protocol_client_over_sasl_ssl(kafka: LocalKafka, mechanism: str) -> None:
    config = kafka.connection_config(mechanism=mechanism)  # the admin: a super user
    assert config.security_protocol == "SASL_SSL"
    with _client(kafka, config) as client:
        assert client.api_versions()
        (node,) = client.brokers()
        assert node.port == int(kafka.bootstrap_servers.rsplit(":", 1)[1])
        assert client.find_coordinator("some-group").node_id == node.node_id
        client.list_groups()
        with pytest.raises(GroupNotFoundError):
            client.describe_share_group("no-such-group")


def test_protocol_client_over_sasl_plaintext(kafka: LocalKafka) -> None:
    config = kafka.connection_config(BOB, listener="sasl_plaintext")
    with _client(kafka, config) as client:
        assert client.brokers()


def test_protocol_client_over_mutual_tls(kafka: LocalKafka) -> None:
    config = kafka.connection_config(listener="ssl")
    assert config.security_protocol == "SSL" and config.cert_file
    with _client(kafka, config) as client:
        (node,) = client.brokers()
        assert f"127.0.0.1:{node.port}" == kafka.secured.bootstrap("ssl")


def test_encrypted_client_key(kafka: LocalKafka) -> None:
    cert, key = kafka.secured.client_cert("admin", key_password="key-pw-Qw3")
    base = kafka.connection_config(listener="ssl")
    good = base.with_changes(cert_file=str(cert), key_file=str(key), key_password="key-pw-Qw3")
    with _client(kafka, good) as client:
        assert client.brokers()
    bad = good.with_changes(key_password="wrong-pw-Kk1")
    text = _fails_fast(lambda: _client(kafka, bad).brokers(), OptionError, "ssl.key.password")
    assert "wrong-pw-Kk1" not in text and "key-pw-Qw3" not in text


def test_acls_apply_to_the_protocol_client(kafka: LocalKafka) -> None:
    group = f"acl-{uuid.uuid4().hex[:6]}"
    with _client(kafka, kafka.connection_config(ALICE)) as client:
        with pytest.raises(AuthorizationError):
            client.describe_share_group_offsets(group)
        kafka.grant(ALICE, "GROUP", group, "DESCRIBE")
        deadline = time.monotonic() + 10  # ACLs reach the authorizer asynchronously
        while True:
            try:
                client.describe_share_group_offsets(group)
                break
            except AuthorizationError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
            except KafkaShareError:
                break  # authorized: any other answer (e.g. no such group) is fine


def test_reauthentication_before_the_session_ends(kafka: LocalKafka) -> None:
    with _client(kafka, kafka.connection_config(BOB, mechanism="SCRAM-SHA-256")) as client:
        client.brokers()
        (conn,) = client._conns.values()
        first_deadline = conn._reauth_at
        assert first_deadline is not None  # the broker granted a session lifetime
        time.sleep(REAUTH_MS / 1000 + 0.3)  # past the session: the broker would disconnect
        client.brokers()
        assert list(client._conns.values()) == [conn]  # same connection, no reconnect
        assert conn._reauth_at is not None and conn._reauth_at > first_deadline


def test_command_config_file_round_trip(kafka: LocalKafka) -> None:
    from confluent_kafka.admin import AdminClient

    for listener, mechanism in (("sasl_ssl", "SCRAM-SHA-512"), ("ssl", None)):
        path = kafka.command_config_file(ALICE if listener == "sasl_ssl" else "admin",
                                         mechanism=mechanism, listener=listener)
        config, settings = ConnectionConfig.from_properties(path.read_text())
        assert settings["security.protocol"] == listener.upper()
        with _client(kafka, config) as client:
            assert client.api_versions()
        # librdkafka takes the translation too (a PEM keystore: key and chain in one file)
        admin = AdminClient({**settings, "bootstrap.servers": kafka.secured.bootstrap(listener)})
        assert admin.list_topics(timeout=10).brokers


def test_kafka_tool_takes_the_command_config_file(kafka: LocalKafka) -> None:
    path = kafka.command_config_file(mechanism="SCRAM-SHA-512")
    out = kafka.run_tool("ShareGroupCommand", "--bootstrap-server", kafka.bootstrap_servers,
                         "--command-config", str(path), "--list", timeout_s=120)
    assert out.returncode == 0


# -- confluent-kafka with the harness's settings -----------------------------------------------


def test_confluent_clients_with_client_config(kafka: LocalKafka) -> None:
    from confluent_kafka import Consumer, Producer

    topic, group = f"sec-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic)
    for resource, name in (("TOPIC", topic), ("GROUP", group)):
        kafka.grant(ALICE, resource, name, "ALL")
    producer = Producer(kafka.client_config(ALICE, mechanism="SCRAM-SHA-256"))
    for i in range(3):
        producer.produce(topic, f"m{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer(kafka.client_config(ALICE, mechanism="OAUTHBEARER", **{
        "group.id": group, "auto.offset.reset": "earliest"}))
    try:
        consumer.subscribe([topic])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < 3 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value() or b"")
        assert sorted(got) == [b"m0", b"m1", b"m2"]
    finally:
        consumer.close()
    mtls = Producer(kafka.client_config(listener="ssl"))
    mtls.produce(topic, b"over mutual TLS")
    assert mtls.flush(30) == 0


# -- each misconfiguration: its cause, within seconds -----------------------------------------


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"])
def test_wrong_password(kafka: LocalKafka, mechanism: str) -> None:
    bad = kafka.connection_config(ALICE, mechanism=mechanism) \
        .with_changes(password="not-the-password-1")
    text = _fails_fast(lambda: _client(kafka, bad).api_versions(), AuthenticationError,
                       f"SASL {mechanism} authentication as 'alice'.*SASL_AUTHENTICATION_FAILED")
    assert "not-the-password-1" not in text and ALICE_PW not in text
    assert "sasl.password" in text


def test_unknown_scram_user(kafka: LocalKafka) -> None:
    config = ConnectionConfig("SASL_SSL", "SCRAM-SHA-512", "nobody", "pw",
                              ca_file=kafka.connection_config().ca_file)
    _fails_fast(lambda: _client(kafka, config).brokers(), AuthenticationError, "nobody")


def test_untrusted_ca(kafka: LocalKafka) -> None:
    config = kafka.connection_config().with_changes(ca_file=None)  # the system's trust store
    _fails_fast(lambda: _client(kafka, config).brokers(), TlsError,
                "not trusted by the system's trust store.*ssl.ca.location")


def test_hostname_mismatch(kafka: LocalKafka) -> None:
    port = kafka.bootstrap_servers.rsplit(":", 1)[1]
    config = kafka.connection_config()
    _fails_fast(lambda: _client(kafka, config, f"localhost:{port}").brokers(), TlsError,
                "hostname mismatch.*ssl.endpoint.identification.algorithm")
    unchecked = config.with_changes(check_hostname=False)
    with _client(kafka, unchecked, f"localhost:{port}") as client:
        assert client.api_versions()


def test_missing_client_certificate(kafka: LocalKafka) -> None:
    config = kafka.connection_config(listener="ssl").with_changes(cert_file=None, key_file=None)
    _fails_fast(lambda: _client(kafka, config).brokers(), TlsError,
                "requires a client certificate.*ssl.certificate.location")


@pytest.mark.parametrize("listener", ["sasl_ssl", "ssl"])
def test_plaintext_client_to_a_tls_port(kafka: LocalKafka, listener: str) -> None:
    client = KafkaProtocolClient(kafka.secured.bootstrap(listener), timeout_s=30)
    text = _fails_fast(client.brokers, SecurityProtocolMismatchError,
                       r"speaks TLS.*security\.protocol=SSL")
    assert "size" not in text


def test_tls_client_to_a_plaintext_port(kafka: LocalKafka) -> None:
    config = kafka.connection_config()
    _fails_fast(lambda: _client(kafka, config, kafka.secured.bootstrap("plaintext")).brokers(),
                SecurityProtocolMismatchError, "speaks plaintext.*security.protocol=")


def test_sasl_client_to_a_tls_only_listener(kafka: LocalKafka) -> None:
    """SASL_SSL to the mutual-TLS listener: TLS fails first, for want of a certificate."""
    config = kafka.connection_config()
    _fails_fast(lambda: _client(kafka, config, kafka.secured.bootstrap("ssl")).brokers(),
                TlsError, "client certificate")


@pytest.mark.parametrize(("listener", "fix"), [("sasl_plaintext", "SASL_PLAINTEXT"),
                                              ("sasl_ssl", "SASL_SSL")])
def test_client_without_sasl_to_a_sasl_port(kafka: LocalKafka, listener: str, fix: str) -> None:
    """The broker answers ApiVersions, then drops the connection: recognised, not retried."""
    config = kafka.connection_config(listener="ssl").with_changes(cert_file=None, key_file=None)\
        if listener == "sasl_ssl" else ConnectionConfig()
    _fails_fast(lambda: _client(kafka, config, kafka.secured.bootstrap(listener)).brokers(),
                SecurityProtocolMismatchError, rf"SASL listener.*security\.protocol={fix}")


def test_sasl_client_to_a_port_without_sasl(kafka: LocalKafka) -> None:
    config = kafka.connection_config(BOB, listener="sasl_plaintext")
    _fails_fast(lambda: _client(kafka, config, kafka.secured.bootstrap("plaintext")).brokers(),
                SecurityProtocolMismatchError, r"does not use SASL.*security\.protocol=PLAINTEXT")


def test_share_group_offsets_and_lag_over_sasl_ssl(kafka: LocalKafka) -> None:
    """The point of it all: a share consumer and the admin's lag, as an ordinary user."""
    from confluent_kafka import AcknowledgeType, ShareConsumer

    topic, group = f"share-{uuid.uuid4().hex[:6]}", f"sg-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic)
    kafka.produce(topic, [f"r{i}".encode() for i in range(5)])
    kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
    for resource, name in (("TOPIC", topic), ("GROUP", group)):
        kafka.grant(ALICE, resource, name, "ALL")
    consumer = ShareConsumer(kafka.client_config(ALICE, mechanism="SCRAM-SHA-512",
                                                 **{"group.id": group,
                                                    "share.acknowledgement.mode": "explicit"}))
    try:
        consumer.subscribe([topic])
        accepted, deadline = 0, time.monotonic() + 60
        while accepted < 3 and time.monotonic() < deadline:
            for msg in consumer.poll(0.5):
                assert msg.error() is None, msg.error()
                kind = AcknowledgeType.ACCEPT if accepted < 3 else AcknowledgeType.RELEASE
                consumer.acknowledge(msg, kind)
                accepted += kind == AcknowledgeType.ACCEPT
            consumer.commit_sync()
        assert accepted == 3
    finally:
        consumer.close()
    with _client(kafka, kafka.connection_config(ALICE, mechanism="SCRAM-SHA-512")) as client:
        described = client.describe_share_group(group)
        assert described.group_id == group
        offsets = client.describe_share_group_offsets(group)
        (topic_offsets,) = offsets.topics
        (partition,) = topic_offsets.partitions
        assert partition.error_code == 0
        assert partition.start_offset is not None and partition.start_offset >= 0
        assert partition.lag == 5 - 3  # 3 of 5 accepted (Kafka 4.2+ reports the lag)


@pytest.mark.parametrize("listener", ["sasl_ssl", "ssl"])
def test_the_journal_replay_consumer_needs_topic_read_and_no_group_acl(
        kafka: LocalKafka, listener: str) -> None:
    """The replay of ``offsets`` journal slots (a plain consumer, assigned partitions, the
    source's connection settings) reads as a principal with READ on the topic and no ACL on
    any group; without READ it fails naming the ACL. Over SASL_SSL (SCRAM) and mutual TLS."""
    import numpy as np

    from pyspark_kafka_share._kafka.partition import TopicPartition
    from pyspark_kafka_share._kafka.replay import read_offsets
    from pyspark_kafka_share._kafka.settings import ClientSettings

    # Principals without any ACL on this topic or group: bob over SCRAM, alice's certificate.
    user = BOB if listener == "sasl_ssl" else ALICE
    topic, group = f"replay-{uuid.uuid4().hex[:6]}", f"sg-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic)
    kafka.produce(topic, [f"r{i}".encode() for i in range(10)])
    conf = kafka.client_config(user, listener=listener)
    bootstrap = conf.pop("bootstrap.servers")
    settings = ClientSettings(bootstrap, group, tuple((k, str(v)) for k, v in conf.items()),
                              timeout_s=10)
    wanted = {TopicPartition(topic, 0): np.asarray([2, 3, 7], np.int64)}
    _fails_fast(lambda: read_offsets(settings, wanted, isolation_level="read_committed"),
                AuthorizationError, f"not allowed to READ topic '{topic}'")
    kafka.grant(user, "TOPIC", topic, "READ")
    deadline = time.monotonic() + 10  # ACLs reach the authorizer asynchronously
    while True:
        try:
            read = read_offsets(settings, wanted, isolation_level="read_committed")
            break
        except AuthorizationError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    got = read[TopicPartition(topic, 0)]
    assert {o: m.value() for o, m in got.records.items()} == {2: b"r2", 3: b"r3", 7: b"r7"}
    assert len(got.missing) == 0
