"""What differs between the Apache Kafka lines with share groups (docs/compatibility.md).

- ``share.delivery.count.limit`` is a group config from 4.3 on; on 4.2 only the broker's
  ``group.share.delivery.count.limit`` sets it (checked in the 4.2.2 and 4.3.1 jars).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["KAFKA_DEFAULT_DELIVERY_LIMIT", "delivery_limit"]

KAFKA_DEFAULT_DELIVERY_LIMIT = 5
"""Kafka's default ``group.share.delivery.count.limit``."""

_BROKER_DELIVERY_LIMIT = "group.share.delivery.count.limit"


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
