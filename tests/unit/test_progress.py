"""The kernel's one reader of a share group's start offsets and lag (``_kafka.progress``)."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.progress import PartitionOffset, group_offsets, total_lag
from pyspark_kafka_share._kafka.protocol import codec, messages
from pyspark_kafka_share.errors import LagUnavailableError, UnknownTopicError


def _partition(index: int, start: int, lag: int, code: int = 0) -> bytes:
    return struct.pack(">iqiqh", index, start, 0, lag, code) + b"\x00" + b"\x00"  # msg, tags


def _response(*partitions: bytes) -> messages.ShareGroupOffsets:
    """A DescribeShareGroupOffsets v1 response for group "g", topic "t"."""
    body = (struct.pack(">i", 0) + b"\x02" + b"\x02g" + b"\x02" + b"\x02t" + bytes(16)
            + bytes([len(partitions) + 1]) + b"".join(partitions) + b"\x00"  # topic's tags
            + struct.pack(">h", 0) + b"\x00" + b"\x00" + b"\x00")  # group: code, msg, tags
    r = codec.Reader(body, flexible=True)
    (result,) = messages.decode_describe_share_group_offsets_response(1, r)
    r.expect_end("response")
    return result


class _Client:
    """What ``group_offsets`` and ``total_lag`` use of a ``KafkaProtocolClient``."""

    def __init__(self, result: messages.ShareGroupOffsets, max_version: int = 1) -> None:
        self.result, self.max_version = result, max_version
        self.bootstrap_servers = "b:9092"

    def describe_share_group_offsets(self, group: str) -> messages.ShareGroupOffsets:
        assert group == "g"
        return self.result

    def api_versions(self) -> dict[int, tuple[int, int]]:
        return {codec.ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: (0, self.max_version)}


def _as_client(fake: _Client) -> Any:
    return fake


def test_the_brokers_minus_one_reads_as_unknown_and_offsets_come_sorted() -> None:
    client = _as_client(_Client(_response(_partition(1, 40, 2), _partition(0, -1, -1),
                                          _partition(2, 7, -1))))
    offsets = group_offsets(client, "g")
    assert offsets == [PartitionOffset("t", 0, None, None), PartitionOffset("t", 1, 40, 2),
                       PartitionOffset("t", 2, 7, None)]
    assert [o.tp for o in offsets] == [TopicPartition("t", p) for p in (0, 1, 2)]
    assert total_lag(client, offsets) == 2


def test_a_partition_error_raises_and_no_lag_at_all_needs_lag_support() -> None:
    with pytest.raises(UnknownTopicError, match="on t-0"):
        group_offsets(_as_client(_Client(_response(_partition(0, 1, 1, code=3)))), "g")
    unknown = [PartitionOffset("t", 0, None, None)]
    assert total_lag(_as_client(_Client(_response(), max_version=1)), unknown) == 0
    with pytest.raises(LagUnavailableError, match=r"Apache Kafka 4\.2"):
        total_lag(_as_client(_Client(_response(), max_version=0)), unknown)
