"""What differs between the Apache Kafka lines with share groups (docs/compatibility.md).

- ``share.delivery.count.limit`` is a group config from 4.3 on; on 4.2 only the broker's
  ``group.share.delivery.count.limit`` sets it (checked in the 4.2.2 and 4.3.1 jars).
- KIP-1240 adds the group configs ``share.partition.max.record.locks`` and
  ``share.renew.acknowledge.enable`` in 4.3; KIP-1191 the dead-letter queue's in 4.4
  (:data:`GROUP_CONFIG_SINCE`). A broker describes every group config it knows (defaults
  included), so what a broker supports is read from it; the table only explains a refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["GROUP_CONFIG_SINCE", "KAFKA_DEFAULT_DELIVERY_LIMIT", "delivery_limit",
           "group_config_since"]

KAFKA_DEFAULT_DELIVERY_LIMIT = 5
"""Kafka's default ``group.share.delivery.count.limit``."""

_BROKER_DELIVERY_LIMIT = "group.share.delivery.count.limit"

GROUP_CONFIG_SINCE: Mapping[str, tuple[str, str]] = {
    "share.delivery.count.limit": ("4.3", "KIP-1240"),
    "share.partition.max.record.locks": ("4.3", "KIP-1240"),
    "share.renew.acknowledge.enable": ("4.3", "KIP-1240"),
    "errors.deadletterqueue.topic.name": ("4.4", "KIP-1191"),
    "errors.deadletterqueue.copy.record.enable": ("4.4", "KIP-1191"),
}
"""The group configs added after Apache Kafka 4.2, the first line with share groups:
``{name: (first Apache Kafka line, KIP)}``."""


def group_config_since(name: str) -> str:
    """Why a broker may not know the group config ``name``: the line that added it."""
    since = GROUP_CONFIG_SINCE.get(name)
    if since is None:
        return "it is not a share-group config of any Apache Kafka line this package knows"
    line, kip = since
    return (f"it is a group config from Apache Kafka {line} on ({kip}): this broker is of "
            "an older line")


def delivery_limit(admin: Any, md: Any, group_configs: Mapping[str, Any],
                   timeout_s: float) -> int:
    """The group's delivery limit: its ``share.delivery.count.limit`` (4.3+), else the
    broker's ``group.share.delivery.count.limit`` (4.2, through ``admin``, a confluent-kafka
    ``AdminClient``, on a broker of metadata ``md``), else Kafka's default when the broker's
    config cannot be read (no DescribeConfigs permission on the broker)."""
    entry = group_configs.get("share.delivery.count.limit")
    if entry is not None and entry.value is not None:
        return int(entry.value)
    from confluent_kafka.admin import ConfigResource, ResourceType

    try:
        resource = ConfigResource(ResourceType.BROKER, str(next(iter(md.brokers))))
        future = next(iter(admin.describe_configs([resource],
                                                  request_timeout=timeout_s).values()))
        value = future.result(timeout=timeout_s).get(_BROKER_DELIVERY_LIMIT)
    except Exception:  # noqa: BLE001 - not allowed or not answered: Kafka's default
        return KAFKA_DEFAULT_DELIVERY_LIMIT
    if value is None or value.value is None:
        return KAFKA_DEFAULT_DELIVERY_LIMIT
    return int(value.value)
