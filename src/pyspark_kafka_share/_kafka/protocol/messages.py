"""Request and response bodies of the share-group admin APIs, per Kafka's message JSON
schemas: ``encode_*_request(version, ...) -> bytes`` and ``decode_*_response(version, Reader)``,
pure functions unit-testable against hand-built bytes, and the typed results they return."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark_kafka_share import __version__
from pyspark_kafka_share._kafka.protocol.codec import (
    GROUP_KEY_TYPE,
    ApiKey,
    Reader,
    is_flexible,
    request_writer,
)
from pyspark_kafka_share.errors import ProtocolDecodeError

# -- result types ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BrokerNode:
    node_id: int
    host: str
    port: int


@dataclass(frozen=True)
class Coordinator:
    key: str | None  # None for FindCoordinator v3 (one key, not echoed)
    node_id: int
    host: str
    port: int
    error_code: int
    error_message: str | None


@dataclass(frozen=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    state: str
    group_type: str


@dataclass(frozen=True)
class TopicAssignment:
    topic_id: str
    topic: str
    partitions: tuple[int, ...]


@dataclass(frozen=True)
class ShareMember:
    member_id: str
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topics: tuple[str, ...]
    assignment: tuple[TopicAssignment, ...]


@dataclass(frozen=True)
class DescribedShareGroup:
    error_code: int
    error_message: str | None
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[ShareMember, ...]
    authorized_operations: int


@dataclass(frozen=True)
class SharePartitionOffset:
    partition: int
    start_offset: int | None  # None: unknown (the broker's -1: no share state)
    leader_epoch: int
    lag: int | None  # None: unknown (the broker's -1), or not reported (before v1)
    error_code: int
    error_message: str | None


@dataclass(frozen=True)
class ShareTopicOffsets:
    topic: str
    topic_id: str
    partitions: tuple[SharePartitionOffset, ...]


@dataclass(frozen=True)
class ShareGroupOffsets:
    group_id: str
    topics: tuple[ShareTopicOffsets, ...]
    error_code: int
    error_message: str | None


@dataclass(frozen=True)
class PartitionResult:
    partition: int
    error_code: int
    error_message: str | None


@dataclass(frozen=True)
class TopicResult:
    topic: str
    topic_id: str
    error_code: int  # DeleteShareGroupOffsets: topic-level; AlterShareGroupOffsets: always 0
    error_message: str | None
    partitions: tuple[PartitionResult, ...] = ()


@dataclass(frozen=True)
class AlterOffsetsResult:
    error_code: int
    error_message: str | None
    topics: tuple[TopicResult, ...]


@dataclass(frozen=True)
class DeleteOffsetsResult:
    error_code: int
    error_message: str | None
    topics: tuple[TopicResult, ...]


# -- request and response bodies ---------------------------------------------------------------


CLIENT_SOFTWARE = ("pyspark-kafka-share", __version__)
"""ApiVersions v3+ ``ClientSoftwareName`` and ``ClientSoftwareVersion`` (KIP-511)."""

_UNSUPPORTED_VERSION = 35


@dataclass(frozen=True)
class ApiVersionsAnswer:
    """An ApiVersions response. ``version``: the schema it was decoded with (0 when the broker
    did not know the version asked for and answered UNSUPPORTED_VERSION in v0, as it must).
    ``finalized``: feature levels in force (``{"share.version": 2}``); ``supported``: the
    ``(min, max)`` levels the broker could run (before v4 a broker leaves out features whose
    minimum is 0, KIP-1022); both empty before v3."""

    version: int
    error_code: int
    versions: dict[int, tuple[int, int]]
    finalized: dict[str, int]
    supported: dict[str, tuple[int, int]]


def encode_api_versions_request(version: int = 0) -> bytes:
    w = request_writer(ApiKey.API_VERSIONS, version)  # v0-v2 have no fields
    if version >= 3:
        w.string(CLIENT_SOFTWARE[0]).string(CLIENT_SOFTWARE[1]).tags()
    return w.getvalue()


def decode_api_versions_response(version: int, r: Reader) -> tuple[int, dict[int, tuple[int, int]]]:
    """``(error_code, {api_key: (min, max)})``; UNSUPPORTED_VERSION still carries the list."""
    answer = decode_api_versions_answer(version, r)
    return answer.error_code, answer.versions


def decode_api_versions_answer(version: int, r: Reader) -> ApiVersionsAnswer:
    """Any ApiVersions response to a v``version`` request. A broker that does not know that
    version answers UNSUPPORTED_VERSION in the v0 schema (whatever was asked): that answer is
    read as v0, never with the schema of the version asked for."""
    code = r.int16()
    if code == _UNSUPPORTED_VERSION:
        version = 0
    r.flexible = is_flexible(ApiKey.API_VERSIONS, version)
    out: dict[int, tuple[int, int]] = {}
    for _ in range(r.array_length()):
        key, lo, hi = r.int16(), r.int16(), r.int16()
        r.skip_tags()
        out[key] = (lo, hi)
    if version >= 1:
        r.int32()  # ThrottleTimeMs
    finalized: dict[str, int] = {}
    supported: dict[str, tuple[int, int]] = {}
    if r.flexible:
        _feature_tags(r, finalized, supported)
    return ApiVersionsAnswer(version, code, out, finalized, supported)


def _feature_tags(r: Reader, finalized: dict[str, int],
                  supported: dict[str, tuple[int, int]]) -> None:
    """ApiVersions v3's tagged fields: 0 SupportedFeatures, 2 FinalizedFeatures (others
    skipped: 1 FinalizedFeaturesEpoch, 3 ZkMigrationReady, any later tag)."""
    for _ in range(r.uvarint()):
        tag, size = r.uvarint(), r.uvarint()
        end = r.pos + size
        if tag in (0, 2):
            for _ in range(r.array_length()):
                name, a, b = r.string(), r.int16(), r.int16()
                r.skip_tags()
                if tag == 0:
                    supported[name] = (a, b)  # MinVersion, MaxVersion
                else:
                    finalized[name] = a  # MaxVersionLevel (then MinVersionLevel)
            if r.pos != end:
                raise ProtocolDecodeError(f"ApiVersions tagged field {tag} is not {size} bytes")
        else:
            r.pos = end
        if r.pos > len(r.data):
            raise ProtocolDecodeError("truncated ApiVersions tagged fields")


def encode_metadata_request(version: int) -> bytes:
    """Metadata for no topics at all: just the brokers."""
    w = request_writer(ApiKey.METADATA, version)
    w.array_header(0)  # Topics: empty (null would mean every topic)
    w.boolean(False)  # AllowAutoTopicCreation
    w.boolean(False)  # IncludeTopicAuthorizedOperations
    return w.tags().getvalue()


def decode_metadata_brokers(r: Reader) -> tuple[BrokerNode, ...]:
    """A Metadata response up to its Topics: ThrottleTimeMs, Brokers, ClusterId, ControllerId
    (the brokers: what both Metadata decoders keep)."""
    r.int32()  # ThrottleTimeMs
    brokers = []
    for _ in range(r.array_length()):
        node, host, port = r.int32(), r.string(), r.int32()
        r.nullable_string()  # Rack
        r.skip_tags()
        brokers.append(BrokerNode(node, host, port))
    r.nullable_string()  # ClusterId
    r.int32()  # ControllerId
    return tuple(brokers)


def decode_metadata_error(version: int, r: Reader) -> int:
    """A Metadata response after its Topics: the top-level ErrorCode (v13+; else 0)."""
    code = r.int16() if version >= 13 else 0
    r.skip_tags()
    return code


def decode_metadata_response(version: int, r: Reader) -> tuple[int, tuple[BrokerNode, ...]]:
    """``(error_code, brokers)``; the request asked for no topics."""
    brokers = decode_metadata_brokers(r)
    if r.array_length():
        raise ProtocolDecodeError("Metadata response lists topics, but none were asked for")
    return decode_metadata_error(version, r), brokers


def encode_find_coordinator_request(version: int, keys: Sequence[str],
                                    key_type: int = GROUP_KEY_TYPE) -> bytes:
    w = request_writer(ApiKey.FIND_COORDINATOR, version)
    if version < 4:
        if len(keys) != 1:
            raise ValueError(f"FindCoordinator v{version} takes exactly one key")
        w.string(keys[0]).int8(key_type)
    else:
        w.int8(key_type).string_array(keys)
    return w.tags().getvalue()


def decode_find_coordinator_response(version: int, r: Reader) -> tuple[Coordinator, ...]:
    r.int32()  # ThrottleTimeMs
    if version < 4:
        code, message = r.int16(), r.nullable_string()
        node, host, port = r.int32(), r.string(), r.int32()
        r.skip_tags()
        return (Coordinator(None, node, host, port, code, message),)
    out = []
    for _ in range(r.array_length()):
        key, node, host, port = r.string(), r.int32(), r.string(), r.int32()
        code, message = r.int16(), r.nullable_string()
        r.skip_tags()
        out.append(Coordinator(key, node, host, port, code, message))
    r.skip_tags()
    return tuple(out)


def encode_list_groups_request(version: int, *, states: Sequence[str] = (),
                               types: Sequence[str] = ("share",)) -> bytes:
    w = request_writer(ApiKey.LIST_GROUPS, version)
    w.string_array(states).string_array(types)
    return w.tags().getvalue()


def decode_list_groups_response(version: int, r: Reader) -> tuple[int, tuple[ListedGroup, ...]]:
    r.int32()  # ThrottleTimeMs
    code = r.int16()
    groups = []
    for _ in range(r.array_length()):
        group_id, protocol_type, state, group_type = r.string(), r.string(), r.string(), r.string()
        r.skip_tags()
        groups.append(ListedGroup(group_id, protocol_type, state, group_type))
    r.skip_tags()
    return code, tuple(groups)


def encode_delete_groups_request(version: int, groups: Sequence[str]) -> bytes:
    return request_writer(ApiKey.DELETE_GROUPS, version).string_array(groups).tags().getvalue()


def decode_delete_groups_response(version: int, r: Reader) -> dict[str, int]:
    """``{group_id: error_code}``."""
    r.int32()  # ThrottleTimeMs
    out: dict[str, int] = {}
    for _ in range(r.array_length()):
        group_id, code = r.string(), r.int16()
        r.skip_tags()
        out[group_id] = code
    r.skip_tags()
    return out


def encode_share_group_heartbeat_request(version: int, group_id: str, member_id: str,
                                         member_epoch: int,
                                         topics: Sequence[str] | None = None) -> bytes:
    w = request_writer(ApiKey.SHARE_GROUP_HEARTBEAT, version)
    w.string(group_id).string(member_id).int32(member_epoch)
    w.string(None).string_array(topics)  # RackId, SubscribedTopicNames
    return w.tags().getvalue()


def decode_share_group_heartbeat_response(version: int, r: Reader) -> tuple[int, str | None]:
    """``(ErrorCode, ErrorMessage)``; the member id, epoch, interval and assignment that follow
    are not read (a leave needs none)."""
    r.int32()  # ThrottleTimeMs
    code, message = r.int16(), r.nullable_string()
    r.skip_rest()
    return code, message


def encode_share_group_describe_request(version: int, groups: Sequence[str],
                                        include_authorized_operations: bool = False) -> bytes:
    w = request_writer(ApiKey.SHARE_GROUP_DESCRIBE, version)
    w.string_array(groups).boolean(include_authorized_operations)
    return w.tags().getvalue()


def _decode_member(r: Reader) -> ShareMember:
    member_id, rack = r.string(), r.nullable_string()
    epoch, client_id, host = r.int32(), r.string(), r.string()
    subscribed = r.string_array()
    assignment = []
    for _ in range(r.array_length()):  # Assignment.TopicPartitions
        topic_id, topic, partitions = r.uuid(), r.string(), r.int32_array()
        r.skip_tags()
        assignment.append(TopicAssignment(topic_id, topic, partitions))
    r.skip_tags()  # the Assignment struct's own tagged fields
    r.skip_tags()  # the member's
    return ShareMember(member_id, rack, epoch, client_id, host, subscribed, tuple(assignment))


def decode_share_group_describe_response(version: int,
                                         r: Reader) -> tuple[DescribedShareGroup, ...]:
    r.int32()  # ThrottleTimeMs
    groups = []
    for _ in range(r.array_length()):
        code, message = r.int16(), r.nullable_string()
        group_id, state = r.string(), r.string()
        group_epoch, assignment_epoch, assignor = r.int32(), r.int32(), r.string()
        members = tuple(_decode_member(r) for _ in range(r.array_length()))
        operations = r.int32()
        r.skip_tags()
        groups.append(DescribedShareGroup(code, message, group_id, state, group_epoch,
                                          assignment_epoch, assignor, members, operations))
    r.skip_tags()
    return tuple(groups)


def encode_describe_share_group_offsets_request(
    version: int, groups: Mapping[str, Mapping[str, Sequence[int]] | None]
) -> bytes:
    """``groups``: ``{group_id: {topic: [partitions]}}``, or ``{group_id: None}`` for all."""
    w = request_writer(ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS, version)
    w.array_header(len(groups))
    for group_id, topics in groups.items():
        w.string(group_id)
        w.array_header(None if topics is None else len(topics))
        for topic, partitions in (topics or {}).items():
            w.string(topic).int32_array(partitions).tags()
        w.tags()
    return w.tags().getvalue()


def decode_describe_share_group_offsets_response(version: int,
                                                 r: Reader) -> tuple[ShareGroupOffsets, ...]:
    r.int32()  # ThrottleTimeMs
    groups = []
    for _ in range(r.array_length()):
        group_id = r.string()
        topics = []
        for _ in range(r.array_length()):
            topic, topic_id = r.string(), r.uuid()
            partitions = []
            for _ in range(r.array_length()):
                index, start, epoch = r.int32(), r.int64(), r.int32()
                lag = r.int64() if version >= 1 else None
                code, message = r.int16(), r.nullable_string()
                r.skip_tags()
                partitions.append(SharePartitionOffset(index, _known(start), epoch, _known(lag),
                                                       code, message))
            r.skip_tags()
            topics.append(ShareTopicOffsets(topic, topic_id, tuple(partitions)))
        code, message = r.int16(), r.nullable_string()
        r.skip_tags()
        groups.append(ShareGroupOffsets(group_id, tuple(topics), code, message))
    r.skip_tags()
    return tuple(groups)


def _known(value: int | None) -> int | None:
    """A count or offset the broker sends as -1 when it does not know it, as None then."""
    return None if value is None or value < 0 else value


def encode_alter_share_group_offsets_request(
    version: int, group_id: str, offsets: Mapping[str, Mapping[int, int]]
) -> bytes:
    """``offsets``: ``{topic: {partition: new start offset}}``."""
    w = request_writer(ApiKey.ALTER_SHARE_GROUP_OFFSETS, version)
    w.string(group_id).array_header(len(offsets))
    for topic, partitions in offsets.items():
        w.string(topic).array_header(len(partitions))
        for partition, offset in partitions.items():
            w.int32(partition).int64(offset).tags()
        w.tags()
    return w.tags().getvalue()


def decode_alter_share_group_offsets_response(version: int, r: Reader) -> AlterOffsetsResult:
    r.int32()  # ThrottleTimeMs
    code, message = r.int16(), r.nullable_string()
    topics = []
    for _ in range(r.array_length()):
        topic, topic_id = r.string(), r.uuid()
        partitions = []
        for _ in range(r.array_length()):
            index, pcode, pmessage = r.int32(), r.int16(), r.nullable_string()
            r.skip_tags()
            partitions.append(PartitionResult(index, pcode, pmessage))
        r.skip_tags()
        topics.append(TopicResult(topic, topic_id, 0, None, tuple(partitions)))
    r.skip_tags()
    return AlterOffsetsResult(code, message, tuple(topics))


def encode_delete_share_group_offsets_request(version: int, group_id: str,
                                              topics: Sequence[str]) -> bytes:
    w = request_writer(ApiKey.DELETE_SHARE_GROUP_OFFSETS, version)
    w.string(group_id).array_header(len(topics))
    for topic in topics:
        w.string(topic).tags()
    return w.tags().getvalue()


def decode_delete_share_group_offsets_response(version: int, r: Reader) -> DeleteOffsetsResult:
    r.int32()  # ThrottleTimeMs
    code, message = r.int16(), r.nullable_string()
    topics = []
    for _ in range(r.array_length()):
        topic, topic_id, tcode, tmessage = r.string(), r.uuid(), r.int16(), r.nullable_string()
        r.skip_tags()
        topics.append(TopicResult(topic, topic_id, tcode, tmessage))
    r.skip_tags()
    return DeleteOffsetsResult(code, message, tuple(topics))

