"""Broker capability decisions, with the broker's ApiVersions answer faked (pure unit test)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from pyspark_kafka_share._kafka import group as _broker
from pyspark_kafka_share.errors import BrokerError
from pyspark_kafka_share.source.options import parse_options

OPTS = parse_options({"kafka.bootstrap.servers": "h:9092", "kafka.group.id": "g",
                      "subscribe": "t", "journalPath": "/tmp/j"})
MD = SimpleNamespace(brokers={1: SimpleNamespace(host="h", port=9092)})
KAFKA_4_3 = {18: (0, 4), 76: (1, 1), 77: (1, 1), 78: (1, 2), 79: (1, 2)}
KAFKA_3_9 = {18: (0, 4), 1: (4, 17)}
KAFKA_4_0_EARLY_ACCESS = {18: (0, 4), 76: (0, 0), 78: (0, 0)}


@pytest.mark.parametrize("versions", [KAFKA_3_9, KAFKA_4_0_EARLY_ACCESS])
def test_a_broker_without_ga_share_groups_is_refused(
    monkeypatch: pytest.MonkeyPatch, versions: dict[int, tuple[int, int]]
) -> None:
    with pytest.raises(BrokerError, match=r"4\.2 or newer"):
        _broker._check_share_support("h:9092", versions)


def test_a_share_group_broker_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    _broker._check_share_support("h:9092", KAFKA_4_3)


def _watch(monkeypatch: pytest.MonkeyPatch, answers: list[bool]) -> Any:
    from pyspark_kafka_share._kafka.share import BrokerWatch

    monkeypatch.setattr(BrokerWatch, "_cluster_answers", lambda self: answers.pop(0))
    return BrokerWatch(OPTS.client, ["t"], limit_s=0.3, every_s=0.05)


def test_an_outage_ends_when_the_cluster_answers_without_any_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """librdkafka reports the outage, never the recovery: an idle consumer's watch must clear
    on a metadata answer alone (else an idle loop fails after the limit though all is well)."""
    from confluent_kafka import KafkaError

    watch = _watch(monkeypatch, [False, True])
    watch.observe([KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")], False)
    assert watch.down
    for _ in range(2):
        time.sleep(0.06)
        watch.observe([], False)
    assert not watch.down


def test_an_outage_longer_than_the_limit_raises_with_its_cause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from confluent_kafka import KafkaError

    watch = _watch(monkeypatch, [False] * 100)
    watch.observe([KafkaError(KafkaError._TRANSPORT, "Connect to h:9092 failed"),
                   KafkaError(KafkaError._ALL_BROKERS_DOWN, "1/1 brokers are down")], False)
    deadline = time.monotonic() + 2
    with pytest.raises(BrokerError, match=r"down for more than 0s.*_ALL_BROKERS_DOWN.*"
                                          r"Connect to h:9092 failed"):
        while time.monotonic() < deadline:
            time.sleep(0.05)
            watch.observe([], False)


def test_a_fatal_error_raises_at_once_even_during_an_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from confluent_kafka import KafkaError

    watch = _watch(monkeypatch, [])
    with pytest.raises(BrokerError, match="_AUTHENTICATION"):
        watch.observe([KafkaError(KafkaError._ALL_BROKERS_DOWN, "down"),
                       KafkaError(KafkaError._AUTHENTICATION, "bad password")], False)
