"""The broker's dead-letter queue (KIP-1191): detection from a group's configs and the feature
level, and the workers' own dead-letter topic refused when the broker dead-letters too; the
delivery limit on Kafka 4.2, which has no group config for it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka.admin import ResourceType

from pyspark_kafka_share._kafka import dlq, lines
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share.errors import OptionError

CONFIGS_4_3 = {"share.record.lock.duration.ms": SimpleNamespace(value="30000")}
CONFIGS_4_4 = {**CONFIGS_4_3, dlq.DLQ_TOPIC: SimpleNamespace(value=""),
               dlq.DLQ_COPY_RECORD: SimpleNamespace(value="false")}


def test_a_broker_before_4_4_has_none() -> None:
    found = dlq.broker_dead_letter_queue(CONFIGS_4_3, {"share.version": 1})
    assert (found.configurable, found.supported, found.active) == (False, False, False)
    assert found.describe().startswith("none: ")


def test_4_4_without_a_topic_is_off_and_with_one_on() -> None:
    off = dlq.broker_dead_letter_queue(CONFIGS_4_4, {"share.version": 2})
    assert (off.supported, off.active, off.topic) == (True, False, None)
    on = dlq.broker_dead_letter_queue(
        {**CONFIGS_4_4, dlq.DLQ_TOPIC: SimpleNamespace(value="dlq.orders"),
         dlq.DLQ_COPY_RECORD: SimpleNamespace(value="true")}, {"share.version": 2})
    assert (on.active, on.topic, on.copy_record) == (True, "dlq.orders", True)
    assert "'dlq.orders' (records and context headers)" in on.describe()


def test_share_version_1_on_a_4_4_broker_is_off_until_raised() -> None:
    found = dlq.broker_dead_letter_queue(
        {**CONFIGS_4_4, dlq.DLQ_TOPIC: SimpleNamespace(value="dlq.orders")},
        {"share.version": 1})
    assert (found.supported, found.active) == (False, False)
    assert "upgrade --feature share.version=2" in found.describe()
    unknown = dlq.broker_dead_letter_queue(
        {**CONFIGS_4_4, dlq.DLQ_TOPIC: "dlq.orders"}, None)  # level unknown: assume on
    assert unknown.active


def test_the_workers_dead_letter_topic_is_refused_when_the_broker_dead_letters(
        monkeypatch: pytest.MonkeyPatch) -> None:
    on = dlq.BrokerDeadLetterQueue(2, True, "dlq.orders", False)
    monkeypatch.setattr(dlq, "group_dead_letter_queue", lambda settings: on)
    settings = ClientSettings("127.0.0.1:9", group_id="orders")
    with pytest.raises(OptionError, match=r"dead_letter_topic.*my-dlq.*'dlq.orders'.*twice"
                                          r".*kafka-share groups dlq orders --off --execute"):
        dlq.check_one_dead_letter_topic(settings, "dead_letter_topic", "my-dlq")
    assert dlq.check_one_dead_letter_topic(settings, "dead_letter_topic", None) is on
    off = dlq.BrokerDeadLetterQueue(2, True, None, False)
    monkeypatch.setattr(dlq, "group_dead_letter_queue", lambda settings: off)
    assert dlq.check_one_dead_letter_topic(settings, "dead_letter_topic", "my-dlq") is off


# -- what differs between lines: the delivery limit ---------------------------------------------


class _Admin:
    """A confluent-kafka AdminClient's describe_configs for one broker resource."""

    def __init__(self, broker_configs: dict[str, str] | Exception) -> None:
        self.broker_configs = broker_configs
        self.asked: list[Any] = []

    def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Any]:
        self.asked.extend(resources)
        configs = self.broker_configs

        class Future:
            def result(self, timeout: float) -> dict[str, Any]:
                if isinstance(configs, Exception):
                    raise configs
                return {k: SimpleNamespace(value=v) for k, v in configs.items()}

        return {resources[0]: Future()}


MD = SimpleNamespace(brokers={1: object()})


def test_the_groups_delivery_limit_wins_on_4_3_and_later() -> None:
    admin = _Admin({"group.share.delivery.count.limit": "7"})
    configs = {"share.delivery.count.limit": SimpleNamespace(value="3")}
    assert lines.delivery_limit(admin, MD, configs, 5) == 3
    assert admin.asked == []


def test_on_4_2_the_brokers_delivery_limit_applies() -> None:
    """Kafka 4.2 has no group config share.delivery.count.limit: the broker's is the limit."""
    admin = _Admin({"group.share.delivery.count.limit": "7"})
    assert lines.delivery_limit(admin, MD, CONFIGS_4_3, 5) == 7
    assert [(r.restype, r.name) for r in admin.asked] == [(ResourceType.BROKER, "1")]
    denied = _Admin(PermissionError("no DescribeConfigs on the cluster"))
    assert lines.delivery_limit(denied, MD, CONFIGS_4_3, 5) == 5  # Kafka's default
