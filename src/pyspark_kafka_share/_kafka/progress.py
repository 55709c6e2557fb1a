"""A share group's progress on its partitions, as the broker reports it: the share-partition
start offsets and the lag (DescribeShareGroupOffsets, over the protocol client).

The one reader of group offsets: the façade (:class:`~pyspark_kafka_share.admin.ShareGroupAdmin`)
and the kernel's backlog reads (``group``) both call :func:`group_offsets`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.protocol import KafkaProtocolClient, iter_partitions
from pyspark_kafka_share._kafka.protocol.codec import ApiKey
from pyspark_kafka_share.errors import LagUnavailableError, error_for

__all__ = ["PartitionOffset", "group_offsets", "lag_supported", "total_lag"]


@dataclass(frozen=True)
class PartitionOffset:
    """Where a share group stands on one topic-partition.

    ``start_offset``: the share-partition start offset: every record before it is done, some
    after it may be done too (the broker persists it lazily, so it trails behind);
    ``None`` while the partition has no share state yet (no member has fetched from it).
    ``lag``: records from the start offset to the end of the partition whose delivery is not
    complete, i.e. not yet ACCEPTed/REJECTed or archived (KIP-1226); ``None`` while the
    partition has no share state, or if the broker predates lag reporting (Kafka < 4.2).
    """

    topic: str
    partition: int
    start_offset: int | None
    lag: int | None

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


def group_offsets(client: KafkaProtocolClient, group: str) -> list[PartitionOffset]:
    """Start offset and lag of every partition ``group`` has share state for, sorted by topic
    and partition; ``None`` where unknown (a lag without a start offset is unknown too). An
    unknown group has none."""
    result = client.describe_share_group_offsets(group)
    out = []
    for topic, p in iter_partitions(result):
        if p.error_code:
            raise error_for(p.error_code, f"offsets of share group {group!r} on "
                            f"{topic}-{p.partition}", p.error_message)
        lag = p.lag if p.start_offset is not None else None
        out.append(PartitionOffset(topic, p.partition, p.start_offset, lag))
    out.sort(key=lambda o: (o.topic, o.partition))
    return out


def lag_supported(client: KafkaProtocolClient) -> bool:
    """Whether the broker reports lag (DescribeShareGroupOffsets v1, Apache Kafka 4.2+)."""
    versions = client.api_versions()
    return versions.get(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, (0, 0))[1] >= 1


def total_lag(client: KafkaProtocolClient, offsets: list[PartitionOffset]) -> int:
    """The sum of the known lags of ``offsets`` (partitions without share state yet are not
    counted); :class:`LagUnavailableError` if the broker does not report lag at all."""
    if offsets and all(o.lag is None for o in offsets) and not lag_supported(client):
        raise LagUnavailableError(
            f"the broker at {client.bootstrap_servers} does not report share-group lag "
            "(DescribeShareGroupOffsets v1 is needed: Apache Kafka 4.2 or newer)")
    return sum(o.lag for o in offsets if o.lag is not None)
