"""The CLI in plain words: help texts, the broker's options, flag names in errors."""

from __future__ import annotations

import argparse
from types import TracebackType
from typing import Any

import pytest

from pyspark_kafka_share import cli
from pyspark_kafka_share.cli import broker as cli_broker
from pyspark_kafka_share.cli import groups as cli_groups
from pyspark_kafka_share.errors import OptionError


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args([*argv, "--help"])
    return capsys.readouterr().out


def test_help_is_plain_words(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ((), ("broker",), ("fetch-jars",), ("groups",), ("groups", "lag")):
        text = _help(capsys, *argv)
        assert "``" not in text and ":mod:" not in text and ":func:" not in text, argv
    assert "watch and manage Kafka share groups" in _help(capsys)


def test_broker_help_says_it_prints_the_address(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, "broker")
    assert "prints its address (HOST:PORT)" in " ".join(text.split())
    for flag in ("--topic NAME[:PARTITIONS]", "--port PORT", "--lock-duration-ms MS"):
        assert flag in text


def test_bootstrap_server_is_shown_optional_with_its_environment_default(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(cli.ENV_BOOTSTRAP_SERVERS, "localhost:9092")
    text = " ".join(_help(capsys, "groups", "lag").split())
    assert "[--bootstrap-server HOST:PORT]" in text
    assert f"optional when the environment variable {cli.ENV_BOOTSTRAP_SERVERS}" in text
    assert "now: localhost:9092" in text


def test_broker_topics_parse_and_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    args = cli.build_parser().parse_args(
        ["broker", "--topic", "orders:3", "--topic", "returns", "--port", "19092"])
    assert args.topic == [("orders", 3), ("returns", 1)] and args.port == 19092
    assert cli_broker._new_topics([("a", 2), ("a", 2), ("b", 1)]) == [("a", 2), ("b", 1)]
    with pytest.raises(OptionError, match="given twice, with 2 and 3 partitions"):
        cli_broker._new_topics([("a", 2), ("a", 3)])
    for bad in ("orders:0", "orders:x", ":3"):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME:PARTITIONS"):
            cli_broker._new_topic_arg(bad)


class _Admin:
    """ShareGroupAdmin raising what the library raises for a partition without offsets."""

    def __enter__(self) -> _Admin:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        return None

    def describe(self, group: str) -> Any:
        return argparse.Namespace(members=[])

    def plan_reset(self, group: str, to: Any, topics: Any) -> Any:
        raise OptionError("topics", topics, "share group 'g' has no offsets yet on orders-7")


def test_errors_name_the_cli_flag(monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli_groups, "_group_admin", lambda args: _Admin())
    code = cli.main(["groups", "reset", "g", "--to", "earliest", "--topic", "orders:7",
                     "--dry-run", "--bootstrap-server", "localhost:1"])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE
    assert "option '--topic'" in err and "option 'topics'" not in err, err


def test_a_missing_broker_is_a_usage_error_naming_the_flag_and_variable(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(cli.ENV_BOOTSTRAP_SERVERS, raising=False)
    monkeypatch.delenv("PYSPARK_KAFKA_SHARE_BOOTSTRAP", raising=False)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["groups", "lag", "g"])
    err = capsys.readouterr().err
    assert exit_.value.code == cli.EXIT_USAGE
    assert "--bootstrap-server HOST:PORT" in err and cli.ENV_BOOTSTRAP_SERVERS in err


def test_one_install_line_covers_the_laptop_quick_start() -> None:
    """README's laptop line, ``[laptop]``: PySpark, the secured local broker (``[local]``,
    ``kafka-share broker --security``) and the exporter; dev installs the exporter too."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    project = (root / "pyproject.toml").read_text()  # (no tomllib on Python 3.10)
    assert 'laptop = ["pyspark-kafka-share[spark,local,exporter]"]' in project
    assert re.search(r'^exporter = \["prometheus-client', project, re.M)
    assert '"pyspark-kafka-share[exporter]",' in project
    readme = (root / "README.md").read_text()
    assert re.search(r"pip install 'pyspark-kafka-share\[laptop\]' +# on a laptop", readme)
