"""The broker's dead-letter queue for share groups (KIP-1191, Apache Kafka 4.4.0+).

A 4.4 broker with ``share.version`` 2 (the default of a cluster formatted by 4.4; raised with
``kafka-features.sh upgrade --feature share.version=2`` after an upgrade) writes every record
a consumer REJECTs, or that reaches the delivery limit, to the topic named by the group config
``errors.deadletterqueue.topic.name``: context headers (``__dlq.errors.*``), and the record
itself with ``errors.deadletterqueue.copy.record.enable``. The topic must allow it (topic
config ``errors.deadletterqueue.group.enable=true``) and by default be named ``dlq.*``
(broker config ``errors.deadletterqueue.topic.name.prefix``). Brokers before 4.4 have none of
these configs. Detection here: the feature level and the group's configs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share.errors import OptionError

__all__ = ["DLQ_COPY_RECORD", "DLQ_TOPIC", "DLQ_TOPIC_ENABLE", "SHARE_VERSION_DLQ",
           "BrokerDeadLetterQueue", "broker_dead_letter_queue", "check_one_dead_letter_topic",
           "group_dead_letter_queue"]

DLQ_TOPIC = "errors.deadletterqueue.topic.name"
"""Group config: the group's dead-letter topic (blank: none)."""

DLQ_COPY_RECORD = "errors.deadletterqueue.copy.record.enable"
"""Group config: copy the record itself, not only the context headers (default false)."""

DLQ_TOPIC_ENABLE = "errors.deadletterqueue.group.enable"
"""Topic config the dead-letter topic needs (``true``), or the broker refuses to write there."""

SHARE_VERSION_DLQ = 2
"""The ``share.version`` feature level that turns the broker's dead-letter queue on."""


@dataclass(frozen=True)
class BrokerDeadLetterQueue:
    """What the broker does with a share group's REJECTed records.

    ``share_version``: the finalized level (``None``: the broker did not say);
    ``configurable``: the broker knows the DLQ group configs (4.4.0+); ``topic``: the group's
    dead-letter topic (``None``: none set); ``copy_record``: whether the record is copied."""

    share_version: int | None
    configurable: bool
    topic: str | None
    copy_record: bool

    @property
    def supported(self) -> bool:
        """The broker can dead-letter (4.4+ with ``share.version`` 2, or level unknown)."""
        return self.configurable and (self.share_version is None
                                      or self.share_version >= SHARE_VERSION_DLQ)

    @property
    def active(self) -> bool:
        """A REJECT of this group is written to :attr:`topic` by the broker."""
        return self.supported and self.topic is not None

    def describe(self) -> str:
        level = "unknown" if self.share_version is None else str(self.share_version)
        if not self.configurable:
            return (f"none: the broker has no dead-letter queue for share groups (Apache Kafka "
                    f"4.4.0+ has; share.version {level})")
        if not self.supported:
            return (f"off: share.version is {level}; raise it to {SHARE_VERSION_DLQ} with "
                    f"kafka-features.sh upgrade --feature share.version={SHARE_VERSION_DLQ}")
        if self.topic is None:
            return f"off: the group sets no {DLQ_TOPIC}"
        what = "records and context headers" if self.copy_record else "context headers only"
        return f"on: REJECTed records go to {self.topic!r} ({what})"


def broker_dead_letter_queue(configs: Mapping[str, Any],
                             features: Mapping[str, int] | None) -> BrokerDeadLetterQueue:
    """From a group's configs (``{name: ConfigEntry or str}``, as DescribeConfigs gives them)
    and the broker's finalized features (``None``: unknown)."""

    def value(name: str) -> str | None:
        entry = configs.get(name)
        raw = getattr(entry, "value", entry)
        return None if raw is None else str(raw)

    topic = value(DLQ_TOPIC)
    return BrokerDeadLetterQueue(
        share_version=None if features is None else features.get("share.version", 0),
        configurable=DLQ_TOPIC in configs,
        topic=topic.strip() or None if topic is not None else None,
        copy_record=(value(DLQ_COPY_RECORD) or "false").lower() == "true",
    )


def group_dead_letter_queue(settings: ClientSettings) -> BrokerDeadLetterQueue:
    """The broker's dead-letter queue of ``settings.group_id``: the group's configs and the
    broker's ``share.version``, read over the settings' own security."""
    from pyspark_kafka_share._kafka.group import admin_client, protocol_client, read_group_configs

    configs = read_group_configs(admin_client(settings), settings.group_id, settings.timeout_s)
    with protocol_client(settings) as client:
        features = client.finalized_features()
    return broker_dead_letter_queue(configs, features)


def check_one_dead_letter_topic(settings: ClientSettings, option: str,
                                dead_letter_topic: str | None) -> BrokerDeadLetterQueue:
    """Refuse ``dead_letter_topic`` (named ``option``) when the broker dead-letters the group's
    REJECTs itself: each REJECTed record would be dead-lettered twice."""
    dlq = group_dead_letter_queue(settings)
    if dead_letter_topic is not None and dlq.active:
        raise OptionError(
            option, dead_letter_topic,
            f"the broker already dead-letters share group {settings.group_id!r}'s REJECTed "
            f"records to {dlq.topic!r} ({DLQ_TOPIC}, share.version "
            f"{dlq.share_version if dlq.share_version is not None else 'unknown'}), so each "
            f"would land twice: leave {option} unset to use the broker's queue, or turn that "
            f"off (kafka-share groups dlq {settings.group_id} --off --execute)")
    return dlq
