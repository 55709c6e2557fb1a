"""The Kafka clients' log lines and configuration errors, without a broker.

The log summarizer and the routing of librdkafka's lines into Python logging; librdkafka's
refusal of a client setting turned into an OptionError that names the user's option, its
value (never a secret's) and a "did you mean". Real clients are created where that is cheap
(librdkafka judges a configuration when a client is created, before any connection).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from pyspark_kafka_share._kafka import logs
from pyspark_kafka_share._kafka.clientconf import (
    LIBRDKAFKA_PROPERTIES,
    REDACTED,
    client_config_error,
    shown,
)
from pyspark_kafka_share._kafka.logs import ClientLog, RepeatFilter
from pyspark_kafka_share._kafka.settings import ClientSettings, check_client_config
from pyspark_kafka_share.errors import OptionError
from pyspark_kafka_share.source.options import parse_options
from pyspark_kafka_share.workers.config import WorkerConfig

CONNECT_FAILED = ("127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection "
                  "refused (after {}ms in state CONNECT)")
PREVIEW = 'The share consumer is in "Preview" and is not recommended for production use'


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the summarizer ---------------------------------------------------------------------------


def test_a_repeated_line_is_admitted_once_per_interval_with_the_count_dropped() -> None:
    clock = Clock()
    repeats = RepeatFilter(interval_s=30, clock=clock)
    assert repeats.admit("a") == (0, 0.0)  # the first occurrence
    assert [repeats.admit("a") for _ in range(500)] == [None] * 500
    assert repeats.admit("b") == (0, 0.0)  # another line is not held back by the first
    clock.now += 30
    assert repeats.admit("a") == (500, 30.0)  # one line that says how many were dropped
    assert repeats.admit("a") is None
    clock.now += 300
    assert repeats.admit("a") == (1, 300.0)


def _client_log(caplog: pytest.LogCaptureFixture, clock: Clock) -> ClientLog:
    caplog.set_level(logging.DEBUG, logger=logs.LOGGER_NAME)
    return ClientLog(repeats=RepeatFilter(interval_s=30, clock=clock))


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == logs.LOGGER_NAME]


def test_client_lines_go_to_python_logging_demoted_and_summarized(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    log = _client_log(caplog, clock)
    # What confluent-kafka calls: logger.log(level, "%s [%s] %s", facility, client, text).
    log.log(logging.WARNING, "%s [%s] %s", "SHARECONSUMER", "rdkafka#consumer-1", PREVIEW)
    for i in range(579):  # 30 s against an unreachable broker
        log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1",
                CONNECT_FAILED.format(i % 3))
    clock.now += 30
    log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-2",
            "[thrd:127.0.0.1:1/bootstrap]: " + CONNECT_FAILED.format(0))
    lines = _lines(caplog)
    assert lines[0] == (logging.DEBUG, f"rdkafka#consumer-1 SHARECONSUMER: {PREVIEW}")
    assert lines[1] == (logging.WARNING, "rdkafka#consumer-1 FAIL: " + CONNECT_FAILED.format(0))
    assert lines[2][0] == logging.WARNING
    assert lines[2][1].endswith("[repeated 578 more times in the last 30 s]")
    assert "[thrd:127.0.0.1:1/bootstrap]" in lines[2][1]  # the line as librdkafka wrote it
    assert len(lines) == 3
    assert log.last_problem == CONNECT_FAILED.format(0)


def test_librdkafka_s_own_suppression_count_does_not_make_a_new_line(
        caplog: pytest.LogCaptureFixture) -> None:
    """librdkafka summarizes repeats itself on a loaded machine: "(after 0ms in state CONNECT,
    1 identical error(s) suppressed)" is the same line as "(after 3ms in state CONNECT)"."""
    log = _client_log(caplog, Clock())
    for text in (CONNECT_FAILED.format(3), CONNECT_FAILED.format(0).replace(
            "CONNECT)", "CONNECT, 1 identical error(s) suppressed)")):
        log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", text)
    assert len(_lines(caplog)) == 1


def test_debug_lines_are_never_summarized(caplog: pytest.LogCaptureFixture) -> None:
    log = _client_log(caplog, Clock())
    for _ in range(5):
        log.log(logging.DEBUG, "%s [%s] %s", "CONNECT", "rdkafka#consumer-1", "connecting")
    assert len(_lines(caplog)) == 5


def test_nothing_is_formatted_for_a_level_nobody_listens_to(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=logs.LOGGER_NAME)
    repeats = RepeatFilter()
    ClientLog(repeats=repeats).log(logging.INFO, "%s [%s] %s", "SHAREFETCH", "c", "reply error")
    assert _lines(caplog) == []
    assert repeats.admit(("SHAREFETCH", "reply error")) == (0, 0.0)  # not even counted


@pytest.fixture
def client_logger() -> Iterator[logging.Logger]:
    """The client logger, restored after a test that sets the environment switch (which
    installs a stderr handler once per process)."""
    logger = logging.getLogger(logs.LOGGER_NAME)
    saved = (list(logger.handlers), logger.propagate, logger.level, logs._STDERR_HANDLER)
    yield logger
    logger.handlers[:] = saved[0]
    logger.propagate, logger.level, logs._STDERR_HANDLER = saved[1], saved[2], saved[3]


def test_the_environment_switch_writes_client_lines_to_stderr(
        monkeypatch: pytest.MonkeyPatch, client_logger: logging.Logger,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(logs.ENV_CLIENT_LOG, raising=False)
    assert "debug" not in logs.client_config({"bootstrap.servers": "h:1"})
    monkeypatch.setenv(logs.ENV_CLIENT_LOG, "DEBUG")
    conf = logs.client_config({"bootstrap.servers": "h:1"})
    assert conf["debug"] == logs.DEBUG_CONTEXTS
    assert logs.client_config({"debug": "broker"})["debug"] == "broker"  # the user's wins
    conf["logger"].log(logging.DEBUG, "%s [%s] %s", "CONNECT", "rdkafka#producer-1", "hello")
    assert "rdkafka#producer-1 CONNECT: hello" in capsys.readouterr().err
    monkeypatch.setenv(logs.ENV_CLIENT_LOG, "loud")
    with pytest.raises(OptionError, match=r"PYSPARK_KAFKA_SHARE_CLIENT_LOG' = 'loud'.*debug"):
        logs.client_config({})


def test_by_default_nothing_reaches_stderr(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # No handler configured: the package's NullHandler keeps Python's last-resort handler
    # from printing WARNING lines.
    monkeypatch.delenv(logs.ENV_CLIENT_LOG, raising=False)
    ClientLog(repeats=RepeatFilter()).log(logging.ERROR, "%s [%s] %s", "FAIL", "c", "boom")
    assert capsys.readouterr().err == ""


# -- configuration errors ---------------------------------------------------------------------


SOURCE = {"kafka.bootstrap.servers": "h:9092", "kafka.group.id": "g", "subscribe": "t",
          "delivery": "at-most-once"}


@pytest.mark.parametrize(("extra", "option", "fix"), [
    ({"kafka.group.idd": "x"}, "kafka.group.idd", "did you mean 'kafka.group.id'?"),
    ({"kafka.securty.protocol": "SSL"}, "kafka.securty.protocol",
     "did you mean 'kafka.security.protocol'?"),
    ({"kafka.max.poll.records": "abc"}, "kafka.max.poll.records", "Invalid value"),
    ({"kafka.debug": "everything"}, "kafka.debug", 'Invalid value "everything"'),
    # librdkafka's check across settings, in the user's names:
    ({"kafka.receive.message.max.bytes": "1000000"}, "kafka.receive.message.max.bytes",
     "'kafka.receive.message.max.bytes' must be >= 'kafka.fetch.max.bytes' + 512"),
])
def test_a_bad_kafka_option_names_the_option_and_the_fix(extra: dict[str, str], option: str,
                                                          fix: str) -> None:
    with pytest.raises(OptionError) as info:
        parse_options({**SOURCE, **extra})
    assert info.value.option == option
    assert fix in str(info.value)


@pytest.mark.parametrize("extra", [
    {"kafka.sasl.pasword": "hunter2-secret"},  # a typo of a secret's name is a secret too
    {"kafka.ssl.key.password": "hunter2-secret", "kafka.ssl.keystore.location": "/k.p12"},
])
def test_a_secret_never_appears_in_the_error(extra: dict[str, str]) -> None:
    with pytest.raises(OptionError) as info:
        parse_options({**SOURCE, **extra})
    assert "hunter2" not in str(info.value)
    assert info.value.value == REDACTED
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_a_secret_quoted_by_the_client_is_redacted() -> None:
    refusal = ValueError('Invalid value "hunter2" for configuration property '
                         '"sasl.oauthbearer.client.secret"')
    err = client_config_error(refusal, {"sasl.oauthbearer.client.secret": "hunter2"},
                              "kafka.{}".format, "kafka.*")
    assert err.option == "kafka.sasl.oauthbearer.client.secret"
    assert "hunter2" not in str(err)
    assert shown("sasl.jaas.config", "x") == REDACTED and shown("client.id", "x") == "x"


def test_the_workers_name_their_arguments() -> None:
    base: dict[str, Any] = {"topics": "t", "group": "g", "bootstrap_servers": "h:9092"}
    with pytest.raises(OptionError) as info:
        WorkerConfig.create(**base, consumer_config={"group.idd": "x"})
    assert info.value.option == "consumer_config['group.idd']"
    assert "did you mean 'group'?" in str(info.value)
    with pytest.raises(OptionError) as info:
        WorkerConfig.create(**base, output_topic="o", producer_config={"lingr.ms": "5"})
    assert info.value.option == "producer_config['lingr.ms']"
    assert "did you mean \"producer_config['linger.ms']\"?" in str(info.value)
    with pytest.raises(OptionError) as info:  # an alias: librdkafka says compression.codec
        WorkerConfig.create(**base, output_topic="o",
                            producer_config={"compression.type": "zip"})
    assert info.value.option == "producer_config['compression.type']"
    assert info.value.value == "zip"


def test_valid_settings_pass() -> None:
    check_client_config(ClientSettings("h:9092", "g", (("client.id", "me"),
                                                        ("fetch.max.bytes", "900000"),
                                                        ("receive.message.max.bytes",
                                                         "1000000"))), {"linger.ms": "1"})


def test_the_property_list_is_the_installed_librdkafkas() -> None:
    """The list behind the suggestions, against the library confluent-kafka bundles
    (``rd_kafka_conf_properties_show``, through ctypes; skipped where that is unavailable)."""
    import ctypes
    import re
    import tempfile

    import confluent_kafka
    from confluent_kafka import cimpl

    try:
        lib, libc = ctypes.CDLL(cimpl.__file__), ctypes.CDLL(None)
        show = lib.rd_kafka_conf_properties_show
    except (OSError, AttributeError) as exc:
        pytest.skip(f"librdkafka not reachable through ctypes: {exc}")
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    show.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile("r") as out:
        fp = libc.fopen(out.name.encode(), b"w")
        show(fp)
        libc.fclose(fp)
        names = {m[1] for line in out for m in [re.match(r"^([a-z0-9_.]+)\s+\|", line)]
                 if m and "." in m[1] and not m[1].endswith("_cb")}
    if confluent_kafka.libversion()[0] == "2.16.0":
        assert names == LIBRDKAFKA_PROPERTIES
    else:  # a newer librdkafka may add properties; suggestions then miss only those
        assert names >= LIBRDKAFKA_PROPERTIES, "properties gone from librdkafka: regenerate"
