"""Request and response bodies a share *consumer* needs, per Kafka's message JSON schemas:
ShareGroupHeartbeat (join, stay, leave; the assignment), Metadata for topics (ids and
leaders), ShareFetch (v1-2: KIP-932, and v2's ShareAcquireMode of KIP-1206 and the RENEW
acknowledgement of KIP-1222) and ShareAcknowledge (v1-2). Pure functions over
:class:`Writer`/:class:`Reader`, like :mod:`.messages`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from pyspark_kafka_share._kafka.protocol.codec import ApiKey, Reader, Writer, request_writer
from pyspark_kafka_share._kafka.protocol.messages import (
    BrokerNode,
    decode_metadata_brokers,
    decode_metadata_error,
)
from pyspark_kafka_share.errors import ProtocolDecodeError


class AckType(IntEnum):
    """Acknowledgement types (``AcknowledgeTypes``): GAP marks an acquired offset that holds
    no record for the consumer (a control record, a compacted-away offset)."""

    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4  # ShareFetch/ShareAcknowledge v2+ (KIP-1222)


class AcquireMode(IntEnum):
    """ShareFetch v2 ``ShareAcquireMode`` (KIP-1206)."""

    BATCH_OPTIMIZED = 0  # MaxRecords is soft: whole producer batches are acquired
    RECORD_LIMIT = 1  # MaxRecords is a strict maximum


TopicPartitionId = tuple[str, int]
"""``(topic id, partition)``: how the share APIs name a partition."""

AckRanges = Sequence[tuple[int, int, Sequence[int]]]
"""Acknowledgement batches of one partition: ``(first offset, last offset, types)``, types
of length 1 (the whole range) or one per offset."""


# -- ShareGroupHeartbeat -----------------------------------------------------------------------


@dataclass(frozen=True)
class HeartbeatAnswer:
    """A ShareGroupHeartbeat response. ``assignment``: ``{topic id: partitions}``, or None
    when the coordinator sent none (unchanged)."""

    error_code: int
    error_message: str | None
    member_id: str | None
    member_epoch: int
    interval_ms: int
    assignment: dict[str, tuple[int, ...]] | None


def encode_heartbeat_request(version: int, group_id: str, member_id: str, member_epoch: int,
                             topics: Sequence[str] | None, *,
                             rack_id: str | None = None) -> bytes:
    """``topics``: the subscription (None: unchanged since the last heartbeat)."""
    w = request_writer(ApiKey.SHARE_GROUP_HEARTBEAT, version)
    w.string(group_id).string(member_id).int32(member_epoch)
    w.string(rack_id).string_array(topics)
    return w.tags().getvalue()


def decode_heartbeat_response(version: int, r: Reader) -> HeartbeatAnswer:
    r.int32()  # ThrottleTimeMs
    code, message = r.int16(), r.nullable_string()
    member_id, epoch, interval = r.nullable_string(), r.int32(), r.int32()
    assignment: dict[str, tuple[int, ...]] | None = None
    if r.int8() >= 0:  # a nullable struct: -1 null, 1 present
        assignment = {}
        for _ in range(r.array_length()):
            topic_id, partitions = r.uuid(), r.int32_array()
            r.skip_tags()
            assignment[topic_id] = partitions
        r.skip_tags()
    r.skip_tags()
    return HeartbeatAnswer(code, message, member_id, epoch, interval, assignment)


# -- Metadata for topics -----------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionLeader:
    partition: int
    error_code: int
    leader_id: int  # -1: none
    leader_epoch: int


@dataclass(frozen=True)
class TopicMetadata:
    name: str | None
    topic_id: str
    error_code: int
    partitions: tuple[PartitionLeader, ...]


def encode_metadata_topics_request(version: int, *, names: Sequence[str] = (),
                                   topic_ids: Sequence[str] = ()) -> bytes:
    """Metadata for topics named, or given by id (the share APIs name topics by id)."""
    w = request_writer(ApiKey.METADATA, version)
    w.array_header(len(names) + len(topic_ids))
    for name in names:
        w.uuid("AAAAAAAAAAAAAAAAAAAAAA").string(name).tags()  # the zero UUID: by name
    for topic_id in topic_ids:
        w.uuid(topic_id).string(None).tags()
    w.boolean(False).boolean(False)  # AllowAutoTopicCreation, IncludeTopicAuthorizedOperations
    return w.tags().getvalue()


def decode_metadata_topics_response(
    version: int, r: Reader
) -> tuple[tuple[BrokerNode, ...], tuple[TopicMetadata, ...]]:
    brokers = decode_metadata_brokers(r)
    topics = []
    for _ in range(r.array_length()):
        code, name, topic_id = r.int16(), r.nullable_string(), r.uuid()
        r.boolean()  # IsInternal
        partitions = []
        for _ in range(r.array_length()):
            pcode, index, leader, epoch = r.int16(), r.int32(), r.int32(), r.int32()
            r.int32_array(), r.int32_array(), r.int32_array()  # replicas, ISR, offline
            r.skip_tags()
            partitions.append(PartitionLeader(index, pcode, leader, epoch))
        r.int32()  # TopicAuthorizedOperations
        r.skip_tags()
        topics.append(TopicMetadata(name, topic_id, code, tuple(partitions)))
    decode_metadata_error(version, r)  # only set for errors this request cannot cause
    return brokers, tuple(topics)


# -- ShareFetch and ShareAcknowledge -----------------------------------------------------------


@dataclass(frozen=True)
class FetchParams:
    """ShareFetch's limits. ``acquire_mode``: v2+ only (v1 is always batch-optimized)."""

    max_wait_ms: int = 500
    min_bytes: int = 1
    max_bytes: int = 52_428_800
    max_records: int = 500
    batch_size: int = 500
    acquire_mode: AcquireMode = AcquireMode.BATCH_OPTIMIZED


@dataclass(frozen=True)
class ShareSessionRequest:
    """One ShareFetch/ShareAcknowledge request's session part. ``partitions``: what the
    request names (with their acknowledgements, possibly none: a fetch of it);
    ``forgotten``: partitions to drop from the share session."""

    group_id: str
    member_id: str
    epoch: int
    partitions: Mapping[TopicPartitionId, AckRanges] = field(default_factory=dict)
    forgotten: Sequence[TopicPartitionId] = ()


def _by_topic(keys: Sequence[TopicPartitionId]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for topic_id, partition in keys:
        out.setdefault(topic_id, []).append(partition)
    return out


def _ack_batches(w: Writer, ranges: AckRanges) -> None:
    w.array_header(len(ranges))
    for first, last, types in ranges:
        w.int64(first).int64(last).array_header(len(types))
        for t in types:
            w.int8(t)
        w.tags()


def _session_topics(w: Writer, req: ShareSessionRequest) -> None:
    topics = _by_topic(list(req.partitions))
    w.array_header(len(topics))
    for topic_id, partitions in topics.items():
        w.uuid(topic_id).array_header(len(partitions))
        for p in partitions:
            w.int32(p)
            _ack_batches(w, req.partitions[(topic_id, p)])
            w.tags()
        w.tags()


def has_renew(req: ShareSessionRequest) -> bool:
    return any(AckType.RENEW in types for ranges in req.partitions.values()
               for _, _, types in ranges)


def encode_share_fetch_request(version: int, req: ShareSessionRequest,
                               params: FetchParams) -> bytes:
    w = request_writer(ApiKey.SHARE_FETCH, version)
    w.string(req.group_id).string(req.member_id).int32(req.epoch)
    w.int32(params.max_wait_ms).int32(params.min_bytes).int32(params.max_bytes)
    w.int32(params.max_records).int32(params.batch_size)
    if version >= 2:
        w.int8(params.acquire_mode).boolean(has_renew(req))  # ShareAcquireMode, IsRenewAck
    elif params.acquire_mode != AcquireMode.BATCH_OPTIMIZED or has_renew(req):
        raise ValueError("record_limit and RENEW need ShareFetch v2 (Kafka 4.2+)")
    _session_topics(w, req)
    forgotten = _by_topic(list(req.forgotten))
    w.array_header(len(forgotten))
    for topic_id, partitions in forgotten.items():
        w.uuid(topic_id).int32_array(partitions).tags()
    return w.tags().getvalue()


def encode_share_acknowledge_request(version: int, req: ShareSessionRequest) -> bytes:
    w = request_writer(ApiKey.SHARE_ACKNOWLEDGE, version)
    w.string(req.group_id).string(req.member_id).int32(req.epoch)
    if version >= 2:
        w.boolean(has_renew(req))  # IsRenewAck
    elif has_renew(req):
        raise ValueError("RENEW needs ShareAcknowledge v2 (Kafka 4.2+)")
    _session_topics(w, req)
    return w.tags().getvalue()


@dataclass(frozen=True)
class AcquiredRange:
    first_offset: int
    last_offset: int
    delivery_count: int


@dataclass(frozen=True)
class SharePartitionAnswer:
    """One partition of a ShareFetch (``records``, ``acquired``) or ShareAcknowledge
    response. ``leader_id``/``leader_epoch``: the current leader when the broker says."""

    topic_id: str
    partition: int
    error_code: int
    error_message: str | None
    ack_error_code: int
    ack_error_message: str | None
    leader_id: int
    leader_epoch: int
    records: bytes | None = None
    acquired: tuple[AcquiredRange, ...] = ()


@dataclass(frozen=True)
class ShareAnswer:
    """A ShareFetch or ShareAcknowledge response. ``lock_timeout_ms``: how long the records
    it acquired (or renewed) are locked; ``nodes``: endpoints of the leaders it names."""

    error_code: int
    error_message: str | None
    lock_timeout_ms: int
    partitions: tuple[SharePartitionAnswer, ...]
    nodes: dict[int, BrokerNode]


def _share_answer(r: Reader, fetch: bool) -> ShareAnswer:
    r.int32()  # ThrottleTimeMs
    code, message, lock_ms = r.int16(), r.nullable_string(), r.int32()
    partitions = []
    for _ in range(r.array_length()):
        topic_id = r.uuid()
        for _ in range(r.array_length()):
            partitions.append(_share_partition(r, topic_id, fetch))
        r.skip_tags()
    nodes = {}
    for _ in range(r.array_length()):
        node, host, port = r.int32(), r.string(), r.int32()
        r.nullable_string()  # Rack
        r.skip_tags()
        nodes[node] = BrokerNode(node, host, port)
    r.skip_tags()
    return ShareAnswer(code, message, lock_ms, tuple(partitions), nodes)


def _share_partition(r: Reader, topic_id: str, fetch: bool) -> SharePartitionAnswer:
    index, code, message = r.int32(), r.int16(), r.nullable_string()
    ack_code, ack_message = (r.int16(), r.nullable_string()) if fetch else (code, message)
    leader, epoch = r.int32(), r.int32()
    r.skip_tags()  # CurrentLeader's
    records: bytes | None = None
    acquired: list[AcquiredRange] = []
    if fetch:
        records = r.nullable_bytes()
        for _ in range(r.array_length()):
            first, last, count = r.int64(), r.int64(), r.int16()
            r.skip_tags()
            if last < first:
                raise ProtocolDecodeError(f"ShareFetch acquired range {first}-{last}")
            acquired.append(AcquiredRange(first, last, count))
    r.skip_tags()
    return SharePartitionAnswer(topic_id, index, code, message, ack_code, ack_message, leader,
                                epoch, records, tuple(acquired))


def decode_share_fetch_response(version: int, r: Reader) -> ShareAnswer:
    return _share_answer(r, fetch=True)


def decode_share_acknowledge_response(version: int, r: Reader) -> ShareAnswer:
    """Partition error codes are acknowledgement errors (``ack_error_code`` = ``error_code``)."""
    return _share_answer(r, fetch=False)
