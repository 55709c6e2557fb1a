"""The admin API, the CLI, the source's ``load()`` and ``start_workers`` against a secured
broker: SASL_SSL (SCRAM) and mutual TLS with ``StandardAuthorizer``.

Every misconfiguration (credentials, certificates, the security protocol, a refused port, an
unknown host) must fail with its cause named within 5 s, and every missing ACL with the
``kafka-acls.sh`` grant that fixes it. No secret may appear in an error or a log line.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pyspark_kafka_share._kafka.group import (
    RENEW_CONFIG,
    inspect_broker,
    read_backlog,
    set_group_configs,
)
from pyspark_kafka_share._kafka.protocol.client import KafkaProtocolClient
from pyspark_kafka_share._kafka.settings import WORKER_NAMES, ClientSettings
from pyspark_kafka_share.admin import ShareGroupAdmin
from pyspark_kafka_share.cli import main
from pyspark_kafka_share.errors import (
    AuthenticationError,
    AuthorizationError,
    ErrorCode,
    KafkaConnectionError,
    SecurityProtocolMismatchError,
    TlsError,
)
from pyspark_kafka_share.harness import LocalKafka
from pyspark_kafka_share.harness.security import ADMIN
from pyspark_kafka_share.workers.config import WorkerConfig
from pyspark_kafka_share.workers.preflight import allow_renew
from tests.helpers import fails_within

pytestmark = pytest.mark.broker

ALICE, ALICE_PW = "alice", "alice-pw-Qk4"
FAIL_WITHIN_S = 5.0
LISTENERS = ("sasl_ssl", "ssl")


@pytest.fixture(scope="module")
def kafka() -> Iterator[LocalKafka]:
    broker = LocalKafka(security="sasl_ssl,ssl", users={ALICE: ALICE_PW}, heap="512m")
    with broker:
        yield broker


@pytest.fixture
def topic(kafka: LocalKafka) -> str:
    name = f"t-sec-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(name, 2)
    kafka.produce(name, [f"v{i}".encode() for i in range(10)])
    return name


@pytest.fixture
def group() -> str:
    return f"g-sec-{uuid.uuid4().hex[:8]}"


def _settings(config: dict[str, Any], group: str = "g", *, timeout_s: float = 30.0,
              names: Any = None) -> ClientSettings:
    config = dict(config)
    bootstrap = config.pop("bootstrap.servers")
    extra = tuple(sorted((k, str(v)) for k, v in config.items()))
    return ClientSettings(bootstrap, group, extra, timeout_s,
                          **({"names": names} if names is not None else {}))


def _fails_fast(call: Callable[[], object], error: type[Exception], match: str) -> str:
    return fails_within(call, error, match, FAIL_WITHIN_S)


def _no_secret(text: str, *secrets: str) -> None:
    for secret in secrets:
        assert secret not in text


# -- the admin API over SASL_SSL (SCRAM) and mutual TLS --------------------------------------


def _admin(kafka: LocalKafka, listener: str, how: str) -> ShareGroupAdmin:
    bootstrap = kafka.secured.bootstrap(listener)
    if how == "properties":
        return ShareGroupAdmin.from_properties_file(
            bootstrap, kafka.command_config_file(listener=listener), timeout_s=10)
    if how == "connection":
        return ShareGroupAdmin(bootstrap, connection=kafka.connection_config(listener=listener),
                               timeout_s=10)
    config = {k: v for k, v in kafka.client_config(listener=listener).items()
              if k != "bootstrap.servers"}
    return ShareGroupAdmin(bootstrap, connection=config, timeout_s=10)


@pytest.mark.parametrize("how", ["config", "connection", "properties"])
@pytest.mark.parametrize("listener", LISTENERS)
def test_admin_api(kafka: LocalKafka, topic: str, group: str, listener: str, how: str) -> None:
    with _admin(kafka, listener, how) as admin:
        assert admin.reset(group, "earliest", [topic]) == {topic: {0: 0, 1: 0}}
        assert group in admin.list_groups()
        assert admin.describe(group).state == "Empty"
        offsets = admin.offsets(group)
        assert [(o.topic, o.partition, o.start_offset) for o in offsets] == \
            [(topic, 0, 0), (topic, 1, 0)]
        assert admin.total_lag(group, offsets) == 10
        admin.set_config(group, "share.record.lock.duration.ms", 20_000)
        assert admin.get_config(group)["share.record.lock.duration.ms"] == "20000"
        admin.delete_offsets(group, [topic])
        assert admin.offsets(group) == []
        admin.delete_group(group)
        assert group not in admin.list_groups()


def test_backlog_is_read_over_sasl_ssl(kafka: LocalKafka, topic: str, group: str) -> None:
    """Lag (progress, lag-bounded batches, the drain probe) on a secured listener."""
    settings = _settings(kafka.client_config(), group)
    with ShareGroupAdmin(settings.bootstrap_servers, connection=dict(settings.extra)) as admin:
        admin.reset(group, "earliest", [topic])
    backlog = read_backlog(settings, [topic])
    assert backlog.total == 10


# -- the CLI with --command-config --------------------------------------------------------------


@pytest.mark.parametrize("listener", LISTENERS)
def test_cli_every_command_with_command_config(
        kafka: LocalKafka, topic: str, group: str, listener: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    common = ["--bootstrap-server", kafka.secured.bootstrap(listener),
              "--command-config", str(kafka.command_config_file(listener=listener)),
              "--timeout", "10"]

    def run(*args: str) -> str:
        code = main(["groups", *args, *common])
        out = capsys.readouterr()
        assert code == 0, out.err
        return out.out

    assert "reset" in run("reset", group, "--to", "earliest", "--topic", topic, "--execute")
    assert group in run("list")
    assert "Empty" in run("describe", group)
    assert "10" in run("lag", group)
    run("delete", group, "--topic", topic, "--execute")
    run("delete", group, "--execute")
    assert group not in run("list")


def test_cli_wrong_password_fails_fast(kafka: LocalKafka, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    good = kafka.command_config_file().read_text()
    password = kafka.secured.users[ADMIN]
    bad = tmp_path / "bad.properties"
    bad.write_text(good.replace(password, "wrong-Pw-123"))
    start = time.monotonic()
    code = main(["groups", "list", "--bootstrap-server", kafka.secured.bootstrap("sasl_ssl"),
                 "--command-config", str(bad)])
    err = capsys.readouterr().err
    assert time.monotonic() - start < FAIL_WITHIN_S
    assert code != 0
    # The fix names the key in the dialect the user gave: a Java properties file's
    # sasl.jaas.config (and the file), not librdkafka's sasl.password.
    assert "authentication" in err and "sasl.jaas.config's password" in err, err
    assert str(bad) in err and "sasl.password" not in err, err
    _no_secret(err, password, "wrong-Pw-123")


def test_cli_refuses_a_java_only_setting(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    props = tmp_path / "jks.properties"
    props.write_text("security.protocol=SSL\nssl.truststore.location=/x/truststore.jks\n"
                     "ssl.truststore.password=secret-Jks-1\n")
    code = main(["groups", "list", "--bootstrap-server", "127.0.0.1:1",
                 "--command-config", str(props)])
    err = capsys.readouterr().err
    assert code != 0
    assert "ssl.truststore" in err and "use ssl.ca.location" in err, err
    _no_secret(err, "secret-Jks-1")


# -- bad credentials, certificates, protocols and addresses: in seconds, cause named ----------

_PORT_CLOSED = "127.0.0.1:1"


def _bad_cases(kafka: LocalKafka) -> dict[str, tuple[dict[str, Any], type[Exception], str]]:
    sasl = kafka.client_config()
    mtls = kafka.client_config(listener="ssl")
    no_ca = {k: v for k, v in sasl.items() if k != "ssl.ca.location"}
    no_cert = {k: v for k, v in mtls.items() if not k.startswith(("ssl.cert", "ssl.key"))}
    by_ip = {**mtls, "bootstrap.servers": mtls["bootstrap.servers"].replace("127.0.0.1",
                                                                            "localhost")}
    return {
        "wrong password": ({**sasl, "sasl.password": "wrong-Pw-123"}, AuthenticationError,
                           r"authentication.*sasl\.password"),
        "untrusted CA": (no_ca, TlsError, r"not trusted.*ssl\.ca\.location"),
        "hostname mismatch": (by_ip, TlsError, r"does not name the host"),
        "no client certificate": (no_cert, TlsError, r"client certificate.*"
                                  r"ssl\.certificate\.location"),
        "plaintext to TLS": ({"bootstrap.servers": sasl["bootstrap.servers"]},
                             SecurityProtocolMismatchError, r"speaks TLS.*security\.protocol"),
        "connection refused": ({**sasl, "bootstrap.servers": _PORT_CLOSED},
                               KafkaConnectionError, r"connection refused"),
        "unknown host": ({**sasl, "bootstrap.servers": "no-such-host.invalid:9093"},
                         KafkaConnectionError, r"unknown host"),
    }


CASES = ["wrong password", "untrusted CA", "hostname mismatch", "no client certificate",
         "plaintext to TLS", "connection refused", "unknown host"]


@pytest.mark.parametrize("case", CASES)
def test_broker_check_fails_fast(kafka: LocalKafka, topic: str, case: str,
                                 caplog: pytest.LogCaptureFixture) -> None:
    """What load() and start_workers() run first (inspect_broker), with their option names."""
    config, error, match = _bad_cases(kafka)[case]
    caplog.set_level(logging.DEBUG)
    text = _fails_fast(lambda: inspect_broker(_settings(config), [topic]), error, match)
    assert "'kafka.bootstrap.servers'" in text
    _no_secret(text + caplog.text, kafka.secured.users[ADMIN], "wrong-Pw-123")
    if "sasl.password" in match or "ssl." in match or "security" in match:
        assert "kafka.s" in text  # the source's option names: kafka.sasl..., kafka.ssl...
    worker = _fails_fast(lambda: inspect_broker(_settings(config, names=WORKER_NAMES),
                                                [topic], bootstrap_name="bootstrap_servers"),
                         error, match)
    assert "'bootstrap_servers'" in worker


@pytest.mark.parametrize("case", CASES)
def test_admin_fails_fast(kafka: LocalKafka, case: str) -> None:
    config, error, match = _bad_cases(kafka)[case]
    bootstrap = config.pop("bootstrap.servers")
    with ShareGroupAdmin(bootstrap, connection=config, timeout_s=30) as admin:
        text = _fails_fast(admin.list_groups, error, match)
    _no_secret(text, kafka.secured.users[ADMIN], "wrong-Pw-123")


# -- ACLs ------------------------------------------------------------------------------------------


def _alice(kafka: LocalKafka, group: str) -> ClientSettings:
    return _settings(kafka.client_config(ALICE), group, timeout_s=10)


def test_topic_without_describe_is_an_authorization_error(kafka: LocalKafka, topic: str,
                                                          group: str) -> None:
    text = _fails_fast(lambda: inspect_broker(_alice(kafka, group), [topic]),
                       AuthorizationError, "kafka-acls")
    assert "does not exist" not in text
    assert "User:alice" in text and f"--topic '{topic}'" in text
    assert "--operation READ" in text


def test_group_without_describe_configs_names_the_acl(kafka: LocalKafka, topic: str,
                                                      group: str) -> None:
    kafka.grant(ALICE, "TOPIC", topic, "READ")
    kafka.grant(ALICE, "GROUP", group, "READ")
    text = _fails_fast(lambda: inspect_broker(_alice(kafka, group), [topic]),
                       AuthorizationError, "DESCRIBE_CONFIGS")
    assert "4.2" not in text  # never a Kafka-version hint for an ACL problem
    assert f"--group '{group}'" in text and "User:alice" in text


def test_group_without_read_is_refused_at_start(kafka: LocalKafka, topic: str,
                                                group: str) -> None:
    """Share consumers need READ on the group: checked before any task starts."""
    kafka.grant(ALICE, "TOPIC", topic, "READ")
    kafka.grant(ALICE, "GROUP", group, "DESCRIBE_CONFIGS")
    text = _fails_fast(lambda: inspect_broker(_alice(kafka, group), [topic]),
                       AuthorizationError, r"READ group")
    assert f"--operation READ --group '{group}'" in text and "User:alice" in text
    kafka.grant(ALICE, "GROUP", group, "READ")
    inspect_broker(_alice(kafka, group), [topic])  # granted: the same settings now pass
    with KafkaProtocolClient(kafka.secured.bootstrap("sasl_ssl"), timeout_s=5,
                             connection=kafka.connection_config(ALICE)) as client:
        assert client.check_share_group_access(group) in (
            ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.GROUP_ID_NOT_FOUND)


def test_starting_offsets_without_alter_configs_names_the_acl(kafka: LocalKafka, topic: str,
                                                              group: str) -> None:
    kafka.grant(ALICE, "TOPIC", topic, "READ")
    kafka.grant(ALICE, "GROUP", group, "READ")
    kafka.grant(ALICE, "GROUP", group, "DESCRIBE_CONFIGS")
    settings = _alice(kafka, group)
    inspect_broker(settings, [topic])  # now allowed
    text = _fails_fast(lambda: set_group_configs(settings,
                                                 {"share.auto.offset.reset": "earliest"},
                                                 option="startingOffsets"),
                       AuthorizationError, "ALTER_CONFIGS")
    assert "'startingOffsets'" in text and f"--group '{group}'" in text


def test_native_workers_without_alter_configs_name_the_renew_setting_and_the_acl(
        kafka: LocalKafka, topic: str, group: str) -> None:
    # client="native" renews long work's locks: a group with RENEW turned off is turned on
    # at start, or the start fails naming the setting, the argument and the grant.
    kafka.grant(ALICE, "TOPIC", topic, "READ")
    kafka.grant(ALICE, "GROUP", group, "READ")
    kafka.grant(ALICE, "GROUP", group, "DESCRIBE_CONFIGS")
    kafka.set_group_config(group, RENEW_CONFIG, "false")
    config = dict(kafka.client_config(ALICE))
    workers = WorkerConfig.create(topics=topic, group=group, client="native",
                                  bootstrap_servers=config.pop("bootstrap.servers"),
                                  consumer_config=config, broker_timeout_s=10)
    facts = inspect_broker(workers.client, [topic])
    assert facts.renew_enabled is False
    text = _fails_fast(lambda: allow_renew(workers, facts), AuthorizationError, "ALTER_CONFIGS")
    assert RENEW_CONFIG in text and "'client'" in text and f"--group '{group}'" in text
    kafka.grant(ALICE, "GROUP", group, "ALTER_CONFIGS")
    allow_renew(workers, facts)
    assert inspect_broker(workers.client, [topic]).renew_enabled is True


# -- the same at load() and start_workers (Spark) ---------------------------------------------


def _load(spark: Any, config: dict[str, Any], topic: str, group: str,
          **options: str) -> Any:
    reader = spark.readStream.format("kafka-share").option("subscribe", topic) \
        .option("kafka.group.id", group).option("delivery", "at-most-once")
    for key, value in {**config, **options}.items():
        reader = reader.option(key if key in options else f"kafka.{key}", str(value))
    return reader.load()


@pytest.fixture(scope="module")
def warm_spark(spark: Any, kafka: LocalKafka) -> Any:
    """A session whose first load() (Python worker start, imports: ~10 s) is behind it, so
    that the checks' own time is measured."""
    kafka.create_topic("warm-up", 1)
    _load(spark, kafka.client_config(), "warm-up", "warm-up")
    return spark


@pytest.mark.parametrize("case", CASES)
def test_load_fails_fast(warm_spark: Any, kafka: LocalKafka, topic: str, group: str,
                         case: str) -> None:
    spark = warm_spark
    config, _error, match = _bad_cases(kafka)[case]
    text = _fails_fast(lambda: _load(spark, config, topic, group), Exception, match)
    assert "kafka.bootstrap.servers" in text
    _no_secret(text, kafka.secured.users[ADMIN], "wrong-Pw-123")


@pytest.mark.parametrize("case", CASES)
def test_start_workers_fails_fast(spark: Any, kafka: LocalKafka, topic: str, group: str,
                                  case: str) -> None:
    from pyspark_kafka_share.workers import start_workers

    config, error, match = _bad_cases(kafka)[case]
    bootstrap = config.pop("bootstrap.servers")
    text = _fails_fast(lambda: start_workers(spark, lambda record: None, topics=[topic],
                                             group=group, bootstrap_servers=bootstrap,
                                             consumer_config=config),
                       error, match)
    assert "'bootstrap_servers'" in text
    if "ssl." in match or "sasl." in match:
        assert "consumer_config[" in text
    _no_secret(text, kafka.secured.users[ADMIN], "wrong-Pw-123")


@pytest.mark.parametrize(("grants", "match"), [
    ((), r"DESCRIBE/READ topic"),
    ((("TOPIC", "READ"), ("GROUP", "DESCRIBE_CONFIGS")), r"READ group"),
    ((("TOPIC", "READ"), ("GROUP", "READ")), r"DESCRIBE_CONFIGS group"),
    ((("TOPIC", "READ"), ("GROUP", "READ"), ("GROUP", "DESCRIBE_CONFIGS")),
     r"'startingOffsets'.*ALTER_CONFIGS group"),
])
def test_load_names_the_missing_acl(warm_spark: Any, kafka: LocalKafka, topic: str,
                                    group: str, grants: tuple[tuple[str, str], ...],
                                    match: str) -> None:
    spark = warm_spark
    for resource, operation in grants:
        kafka.grant(ALICE, resource, topic if resource == "TOPIC" else group, operation)
    text = _fails_fast(lambda: _load(spark, kafka.client_config(ALICE), topic, group,
                                     startingOffsets="earliest"), Exception, match)
    assert "kafka-acls.sh" in text and "User:alice" in text
    assert "does not exist" not in text and "4.2" not in text


def test_consumer_refused_at_run_time_names_the_acl(kafka: LocalKafka, topic: str,
                                                    group: str) -> None:
    """What a task or a worker sees when READ on the group is missing (revoked after the
    start): an AuthorizationError naming the group and the grant, within seconds. Spark
    retries a failed task (spark.task.maxFailures); each attempt fails as fast."""
    from pyspark_kafka_share._kafka.share import BrokerWatch, ShareSession

    kafka.grant(ALICE, "TOPIC", topic, "READ")
    settings = _alice(kafka, group)
    session = ShareSession.open(settings.consumer(client_id="refused"), [topic], 5.0)
    watch = BrokerWatch(settings, [topic], limit_s=30.0)

    def poll_until_refused() -> None:
        deadline = time.monotonic() + 2 * FAIL_WITHIN_S
        while time.monotonic() < deadline:
            msgs, _ = session.poll(0.2)
            watch.observe(session.take_errors(), bool(msgs))

    try:
        text = _fails_fast(poll_until_refused, AuthorizationError, r"READ group")
    finally:
        session.close()
    assert f"--operation READ --group '{group}'" in text and "User:alice" in text


@pytest.mark.parametrize("listener", LISTENERS)
def test_source_lag_and_drain_on_a_secured_listener(warm_spark: Any, kafka: LocalKafka,
                                                    group: str, listener: str,
                                                    tmp_path: Path) -> None:
    """Parity with PLAINTEXT: lag in progress, and AvailableNow ends at the drain (no
    trailing empty batch waiting out pollTimeoutMs)."""
    import json

    topic = f"t-parity-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 2)
    kafka.produce(topic, [f"v{i}".encode() for i in range(2000)])
    df = _load(warm_spark, kafka.client_config(listener=listener), topic, group,
               startingOffsets="earliest", journalPath=str(tmp_path / "journal"),
               delivery="exactly-once")
    q = (df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "chk")).trigger(availableNow=True)
         .start())
    q.awaitTermination(240)
    assert not q.isActive and q.exception() is None
    rows = [p.numInputRows for p in q.recentProgress]
    assert sum(rows) == 2000
    assert 0 not in rows, rows  # no trailing empty batch
    lags = [json.loads(p.sources[0].latestOffset or "{}").get("lag") for p in q.recentProgress]
    assert lags and all(lag is not None for lag in lags), lags
    assert warm_spark.read.parquet(str(tmp_path / "out")).count() == 2000


def test_start_workers_names_the_missing_group_read(warm_spark: Any, kafka: LocalKafka,
                                                    topic: str, group: str) -> None:
    from pyspark_kafka_share.workers import start_workers

    kafka.grant(ALICE, "TOPIC", topic, "READ")
    kafka.grant(ALICE, "GROUP", group, "DESCRIBE_CONFIGS")
    config = kafka.client_config(ALICE)
    bootstrap = config.pop("bootstrap.servers")
    text = _fails_fast(lambda: start_workers(warm_spark, lambda record: None, topics=[topic],
                                             group=group, bootstrap_servers=bootstrap,
                                             consumer_config=config),
                       AuthorizationError, r"READ group")
    assert f"--operation READ --group '{group}'" in text
    _no_secret(text, ALICE_PW)
