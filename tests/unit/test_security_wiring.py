"""One connection config for every client: how security settings reach the protocol client,
the confluent-kafka clients, the admin API and the CLI; errors that name the ACL to grant."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from pyspark_kafka_share._kafka import access
from pyspark_kafka_share._kafka.access import authorization_error, principal_of, probe_broker
from pyspark_kafka_share._kafka.connection import ConnectionConfig
from pyspark_kafka_share._kafka.settings import WORKER_NAMES, ClientSettings
from pyspark_kafka_share._kafka.share import raise_client_errors
from pyspark_kafka_share.admin import ShareGroupAdmin
from pyspark_kafka_share.cli import build_parser
from pyspark_kafka_share.errors import AuthorizationError, KafkaConnectionError, OptionError
from pyspark_kafka_share.workers.config import WorkerConfig

SECRET = "s3cret-Pw-77"
SCRAM = (("sasl.mechanism", "SCRAM-SHA-512"), ("sasl.password", SECRET),
         ("sasl.username", "alice"), ("security.protocol", "SASL_SSL"),
         ("ssl.ca.location", "/etc/ca.pem"))


def _token(_config: str) -> tuple[str, float]:
    return "token", time.time() + 60


def test_the_protocol_client_connects_as_the_librdkafka_clients() -> None:
    settings = ClientSettings("h:9093", "g", SCRAM)
    conn = settings.connection
    assert conn is not None
    assert (conn.security_protocol, conn.sasl_mechanism, conn.username, conn.ca_file) == \
        ("SASL_SSL", "SCRAM-SHA-512", "alice", "/etc/ca.pem")
    assert conn.password == SECRET
    assert settings.connection is ClientSettings("h:9093", "other", SCRAM).connection  # once
    assert SECRET not in repr(settings) and SECRET not in repr(conn)


def test_a_token_callback_reaches_every_client_as_a_callable() -> None:
    extra = (("sasl.mechanism", "OAUTHBEARER"), ("security.protocol", "SASL_SSL"))
    settings = ClientSettings("h:9093", "g", extra, token_provider=_token)
    assert settings.consumer(client_id="c")["oauth_cb"] is _token
    assert settings.admin()["oauth_cb"] is _token
    assert settings.producer()["oauth_cb"] is _token
    assert settings.replay_consumer(isolation_level="read_committed")["oauth_cb"] is _token
    conn = settings.connection
    assert conn is not None and conn.token_provider is _token


def test_the_journal_replay_consumer_connects_as_the_share_consumer_and_joins_nothing() -> None:
    extra = (*SCRAM, ("fetch.max.bytes", "1000000"), ("max.poll.records", "100"),
             ("client.id", "mine"))
    conf = ClientSettings("h:9093", "g", extra).replay_consumer(isolation_level="read_committed")
    shared = {k: v for k, v in SCRAM}
    assert {k: conf[k] for k in shared} == shared, "the same security settings"
    assert conf["fetch.max.bytes"] == "1000000" and "max.poll.records" not in conf
    assert (conf["isolation.level"], conf["enable.auto.commit"], conf["auto.offset.reset"]) \
        == ("read_committed", False, "error")
    assert conf["group.id"] == "g", "confluent-kafka needs one; assign() never joins it"


def test_workers_keep_oauth_cb_typed() -> None:
    config = WorkerConfig.create(
        topics="t", group="g", bootstrap_servers="h:9093",
        consumer_config={"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER",
                         "oauth_cb": _token})
    assert config.token_provider is _token
    assert "oauth_cb" not in dict(config.consumer_config)
    assert config.client.consumer(client_id="c")["oauth_cb"] is _token


def test_settings_the_protocol_client_cannot_use_warn_once(
        caplog: pytest.LogCaptureFixture) -> None:
    extra = (("security.protocol", "SSL"), ("ssl.ca.pem", "-----BEGIN CERTIFICATE-----"),
             ("ssl.key.password", SECRET))
    caplog.set_level(logging.WARNING)
    assert ClientSettings("h:9093", "g", extra).connection is None
    assert ClientSettings("h:9093", "g2", extra).connection is None
    lines = [r.getMessage() for r in caplog.records if "protocol client" in r.getMessage()]
    assert len(lines) == 1
    assert "kafka.ssl.ca.pem" in lines[0] and "lag" in lines[0]
    assert SECRET not in caplog.text


def test_the_probe_names_a_refused_address_in_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    # A refusal is reported at once, not after the probe's timeout: that timeout is raised to
    # the settings' 30 s so that a bound of 10 s (was 2 s under the 3 s timeout) holds on a
    # loaded 2-core machine and still tells the two apart.
    monkeypatch.setattr(access, "PROBE_TIMEOUT_S", 30.0)
    settings = ClientSettings("127.0.0.1:1", "g", names=WORKER_NAMES)
    assert settings.timeout_s >= 30
    start = time.monotonic()
    with pytest.raises(KafkaConnectionError, match=r"'bootstrap_servers'.*connection refused"):
        probe_broker(settings)
    assert time.monotonic() - start < 10


def test_principal_and_grant_in_an_authorization_error() -> None:
    settings = ClientSettings("h:9093", "orders", SCRAM)
    err = authorization_error(settings, "group", "orders", ("READ",), "joining")
    assert isinstance(err, AuthorizationError)
    assert "'User:alice'" in str(err)
    assert "--allow-principal 'User:alice' --operation READ --group 'orders'" in str(err)
    assert principal_of(ConnectionConfig(security_protocol="SSL", cert_file="c.pem")) is None
    mtls = ClientSettings("h:9093", "g", (("security.protocol", "SSL"),
                                          ("ssl.certificate.location", "c.pem")))
    assert "ssl.principal.mapping.rules" in str(
        authorization_error(mtls, "topic", "t", ("READ",), "x"))


def test_a_consumer_denial_names_the_group_and_the_grant() -> None:
    settings = ClientSettings("h:9093", "orders", SCRAM)
    errors: list[Any] = [KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED,
                                    "Broker: Group authorization failed")]
    with pytest.raises(AuthorizationError, match=r"group 'orders'.*kafka-acls.*--group 'orders'"):
        raise_client_errors(errors, settings, ["t"])
    errors = [KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED,
                         "Broker: Topic authorization failed")]
    with pytest.raises(AuthorizationError, match=r"--operation READ --topic 't'"):
        raise_client_errors(errors, settings, ["t"])


def test_admin_takes_a_connection_config_librdkafka_settings_or_a_properties_file(
        tmp_path: Path) -> None:
    admin = ShareGroupAdmin("h:9093", connection=dict(SCRAM))
    assert admin.connection.username == "alice"
    assert SECRET not in repr(admin.connection)
    typed = ConnectionConfig.from_client_settings(dict(SCRAM))
    admin = ShareGroupAdmin("h:9093", connection=typed)
    assert admin.connection is typed
    assert dict(admin._settings.extra)["sasl.username"] == "alice"  # the AdminClient's too
    assert ShareGroupAdmin("h:9093").connection == ConnectionConfig()
    with pytest.raises(OptionError, match=r"connection.*ConnectionConfig, or a dict"):
        ShareGroupAdmin("h:9093", connection="SASL_SSL")  # type: ignore[arg-type]
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-256\n"
                     "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule "
                     f'required username="bob" password="{SECRET}";\n')
    admin = ShareGroupAdmin.from_properties_file("h:9093", props)
    assert (admin.connection.sasl_mechanism, admin.connection.username) == \
        ("SCRAM-SHA-256", "bob")
    with pytest.raises(OptionError, match=r"command-config.*cannot read"):
        ShareGroupAdmin.from_properties_file("h:9093", tmp_path / "missing.properties")


@pytest.mark.parametrize("command", ["list", "describe g", "lag g", "reset g --to earliest",
                                     "delete g"])
def test_every_group_command_takes_command_config(command: str) -> None:
    args = build_parser().parse_args(["groups", *command.split(), "--bootstrap-server", "h:1",
                                      "--command-config", "c.properties"])
    assert args.command_config == "c.properties"


def test_broker_takes_a_security_mode() -> None:
    assert build_parser().parse_args(["broker", "--security", "sasl_ssl"]).security == \
        "sasl_ssl"


def test_a_certificate_principal_is_read_from_the_certificate(tmp_path: Path) -> None:
    from pyspark_kafka_share.harness.security import CertificateAuthority

    cert, key = CertificateAuthority(tmp_path).issue("alice")
    mtls = ClientSettings("h:9093", "g", (("security.protocol", "SSL"),
                                          ("ssl.certificate.location", str(cert)),
                                          ("ssl.key.location", str(key))))
    text = str(authorization_error(mtls, "group", "g", ("READ",), "joining"))
    assert "--allow-principal 'User:CN=alice" in text and "ssl.principal.mapping.rules" in text


def test_an_expired_broker_certificate_is_named_as_such() -> None:
    import ssl

    from pyspark_kafka_share._kafka.protocol.transport import tls_error
    from pyspark_kafka_share.errors import TlsError

    exc = ssl.SSLCertVerificationError(1, "certificate verify failed")
    exc.verify_code, exc.verify_message = 10, "certificate has expired"
    err = tls_error(exc, "h:9093", ConnectionConfig(security_protocol="SSL"), handshake=True)
    assert isinstance(err, TlsError)
    assert "has expired" in str(err) and "renew" in str(err)
    assert "set ssl.ca.location" not in str(err)


def test_the_connection_type_is_public() -> None:
    import pyspark_kafka_share
    from pyspark_kafka_share import connection

    assert pyspark_kafka_share.ConnectionConfig is connection.ConnectionConfig is ConnectionConfig
    assert "ConnectionConfig" in pyspark_kafka_share.__all__
