"""The CLI's default broker comes from its own environment variable (no broker needed)."""

from __future__ import annotations

import pytest

from pyspark_kafka_share import cli


@pytest.mark.parametrize(("own", "fallback", "expected"), [
    ("a:9092", "b:9092", "a:9092"),  # the CLI's own variable first
    (None, "b:9092", "b:9092"),  # the local harness's, as before
    ("", "b:9092", "b:9092"),  # empty: not set
])
def test_the_default_bootstrap_server_is_read_from_the_environment(
        monkeypatch: pytest.MonkeyPatch, own: str | None, fallback: str,
        expected: str) -> None:
    for name, value in ((cli.ENV_BOOTSTRAP_SERVERS, own),
                        ("PYSPARK_KAFKA_SHARE_BOOTSTRAP", fallback)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    args = cli.build_parser().parse_args(["groups", "list"])
    assert args.bootstrap_server == expected


def test_without_a_default_the_bootstrap_server_is_required(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(cli.ENV_BOOTSTRAP_SERVERS, raising=False)
    monkeypatch.delenv("PYSPARK_KAFKA_SHARE_BOOTSTRAP", raising=False)
    with pytest.raises(SystemExit) as exit_:
        cli.build_parser().parse_args(["groups", "list"])
    assert exit_.value.code == cli.EXIT_USAGE
    assert "--bootstrap-server" in capsys.readouterr().err
