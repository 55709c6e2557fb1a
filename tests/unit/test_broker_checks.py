"""Broker capability decisions, with the broker's ApiVersions answer faked (pure unit test)."""

from __future__ import annotations

from types import SimpleNamespace

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
    monkeypatch.setattr(_broker, "api_versions", lambda host, port, timeout: versions)
    with pytest.raises(BrokerError, match=r"4\.2 or newer"):
        _broker._check_share_support(OPTS.client, MD, 1.0)


def test_a_share_group_broker_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_broker, "api_versions", lambda host, port, timeout: KAFKA_4_3)
    _broker._check_share_support(OPTS.client, MD, 1.0)
