"""A small, typed client for the parts of the Kafka wire protocol that confluent-kafka lacks.

confluent-kafka's ``AdminClient`` has no share-group APIs (KIP-932), so this module speaks them
directly over a plaintext TCP socket. It implements, per Kafka's message JSON schemas:

============================  =======  ==========================================
API                           key      versions (flexible from)
============================  =======  ==========================================
ApiVersions                   18       0 (request header v1, response header v0)
Metadata                      3        11-13 (all flexible)
FindCoordinator               10       3-6 (3: one key; 4+: CoordinatorKeys batch)
ListGroups                    16       5 (TypesFilter)
DeleteGroups                  42       0-2 (flexible from 2)
ShareGroupDescribe            77       1
DescribeShareGroupOffsets     90       0-1 (1 adds Lag)
AlterShareGroupOffsets        91       0
DeleteShareGroupOffsets       92       0
============================  =======  ==========================================

Layers, each usable on its own:

- :class:`Writer` / :class:`Reader`: primitive encoding (big-endian ints, unsigned varints,
  classic and compact strings/arrays, UUIDs, tagged fields).
- ``encode_*_request(version, ...) -> bytes`` and ``decode_*_response(version, Reader)``: pure
  functions for request/response *bodies*; unit-testable against hand-built bytes.
- :class:`BrokerConnection`: one socket, request framing, headers, correlation ids, deadlines.
- :class:`KafkaProtocolClient`: bootstrap, version negotiation, coordinator discovery with
  bounded retries, and one method per API; group-level errors become exceptions
  (:class:`KafkaApiError` subclasses), partition/topic-level error codes are returned.

Only ``PLAINTEXT`` is supported; anything else raises
:class:`UnsupportedSecurityProtocolError`. The client is not thread-safe.
"""

from __future__ import annotations

import base64
import socket
import struct
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TypeVar

from pyspark_kafka_share.errors import BrokerError, KafkaShareError, OptionError

__all__ = [
    "AlterOffsetsResult",
    "AuthorizationError",
    "BrokerConnection",
    "BrokerNode",
    "Coordinator",
    "CoordinatorNotAvailableError",
    "DeleteOffsetsResult",
    "DescribedShareGroup",
    "GroupNotEmptyError",
    "GroupNotFoundError",
    "KafkaApiError",
    "KafkaConnectionError",
    "KafkaProtocolClient",
    "ListedGroup",
    "PartitionResult",
    "ProtocolDecodeError",
    "Reader",
    "ShareGroupOffsets",
    "ShareMember",
    "SharePartitionOffset",
    "ShareTopicOffsets",
    "TopicAssignment",
    "TopicResult",
    "UnknownTopicError",
    "UnsupportedSecurityProtocolError",
    "UnsupportedVersionError",
    "Writer",
    "api_versions",
    "check_security_protocol",
    "error_for",
    "error_name",
    "iter_partitions",
    "parse_bootstrap",
]

T = TypeVar("T")

# -- API keys and the versions this module implements ------------------------------------------

METADATA = 3
FIND_COORDINATOR = 10
LIST_GROUPS = 16
API_VERSIONS = 18
DELETE_GROUPS = 42
SHARE_GROUP_DESCRIBE = 77
DESCRIBE_SHARE_GROUP_OFFSETS = 90
ALTER_SHARE_GROUP_OFFSETS = 91
DELETE_SHARE_GROUP_OFFSETS = 92


@dataclass(frozen=True)
class _ApiSpec:
    name: str
    min_version: int
    max_version: int
    flexible_from: int  # first flexible version (a large number: never flexible)


API_SPECS: dict[int, _ApiSpec] = {
    API_VERSIONS: _ApiSpec("ApiVersions", 0, 0, 3),
    METADATA: _ApiSpec("Metadata", 11, 13, 9),
    FIND_COORDINATOR: _ApiSpec("FindCoordinator", 3, 6, 3),
    LIST_GROUPS: _ApiSpec("ListGroups", 5, 5, 3),
    DELETE_GROUPS: _ApiSpec("DeleteGroups", 0, 2, 2),
    SHARE_GROUP_DESCRIBE: _ApiSpec("ShareGroupDescribe", 1, 1, 0),
    DESCRIBE_SHARE_GROUP_OFFSETS: _ApiSpec("DescribeShareGroupOffsets", 0, 1, 0),
    ALTER_SHARE_GROUP_OFFSETS: _ApiSpec("AlterShareGroupOffsets", 0, 0, 0),
    DELETE_SHARE_GROUP_OFFSETS: _ApiSpec("DeleteShareGroupOffsets", 0, 0, 0),
}
"""What this module implements: ``{api_key: spec}``."""

GROUP_KEY_TYPE = 0
"""FindCoordinator ``KeyType`` for groups (consumer and share groups alike)."""

_MAX_FRAME = 64 * 1024 * 1024

# -- errors ------------------------------------------------------------------------------------

_ERROR_NAMES: dict[int, str] = {
    -1: "UNKNOWN_SERVER_ERROR", 0: "NONE", 3: "UNKNOWN_TOPIC_OR_PARTITION",
    5: "LEADER_NOT_AVAILABLE", 6: "NOT_LEADER_OR_FOLLOWER", 7: "REQUEST_TIMED_OUT",
    8: "BROKER_NOT_AVAILABLE", 13: "NETWORK_EXCEPTION", 14: "COORDINATOR_LOAD_IN_PROGRESS",
    15: "COORDINATOR_NOT_AVAILABLE", 16: "NOT_COORDINATOR", 17: "INVALID_TOPIC_EXCEPTION",
    24: "INVALID_GROUP_ID", 25: "UNKNOWN_MEMBER_ID", 27: "REBALANCE_IN_PROGRESS",
    29: "TOPIC_AUTHORIZATION_FAILED", 30: "GROUP_AUTHORIZATION_FAILED",
    31: "CLUSTER_AUTHORIZATION_FAILED", 35: "UNSUPPORTED_VERSION", 40: "INVALID_CONFIG",
    42: "INVALID_REQUEST", 56: "KAFKA_STORAGE_ERROR", 68: "NON_EMPTY_GROUP",
    69: "GROUP_ID_NOT_FOUND", 78: "OFFSET_NOT_AVAILABLE", 86: "GROUP_SUBSCRIBED_TO_TOPIC",
    100: "UNKNOWN_TOPIC_ID", 124: "FENCED_STATE_EPOCH",
}


def error_name(code: int) -> str:
    """Kafka's name for an error code (``NON_EMPTY_GROUP`` for 68), or ``ERROR_<code>``."""
    return _ERROR_NAMES.get(code, f"ERROR_{code}")


class UnsupportedSecurityProtocolError(KafkaShareError, ValueError):
    """A security protocol other than PLAINTEXT was asked of the plaintext-only protocol client."""


class KafkaConnectionError(BrokerError):
    """A broker could not be reached, closed the connection or did not answer in time."""


class ProtocolDecodeError(BrokerError):
    """A broker's response could not be decoded (truncated, malformed or unexpected)."""


class KafkaApiError(BrokerError):
    """A broker answered a request with a non-zero error code.

    Attributes: ``code`` (Kafka's numeric code), ``error`` (its name, e.g. ``NON_EMPTY_GROUP``),
    ``broker_message`` (the broker's own error message, if it sent one).
    """

    default_hint = ""

    def __init__(self, code: int, context: str, broker_message: str | None = None,
                 hint: str | None = None, *, from_broker: bool = True) -> None:
        self.code = code
        self.error = error_name(code)
        # Brokers end their messages with '.'; this text adds its own punctuation.
        self.broker_message = broker_message.rstrip(". ") or None if broker_message else None
        broker_message = self.broker_message
        text = f"{context}: the broker answered {self.error} (error code {code})" \
            if from_broker else context
        if broker_message:
            text += f": {broker_message}"
        hint = self.default_hint if hint is None else hint
        if hint:
            text += f". {hint}"
        super().__init__(text)


class CoordinatorNotAvailableError(KafkaApiError):
    """The group coordinator is moving or loading (retriable; retried until the timeout)."""

    default_hint = "The group coordinator is unavailable or moving; retry later"


class GroupNotEmptyError(KafkaApiError):
    """The share group still has members (``NON_EMPTY_GROUP``, a.k.a. GROUP_NOT_EMPTY)."""

    default_hint = (
        "A share group's offsets can only be reset or deleted, and the group itself deleted, "
        "while the group is empty: stop all of its consumers (a crashed member leaves after "
        "the group's session timeout) and retry"
    )


class GroupNotFoundError(KafkaApiError):
    """The group does not exist, or is not a share group (``GROUP_ID_NOT_FOUND``)."""

    default_hint = "No share group of that name exists (check the name and the group type)"


class UnknownTopicError(KafkaApiError):
    """A topic or partition does not exist (``UNKNOWN_TOPIC_OR_PARTITION``/``UNKNOWN_TOPIC_ID``)."""


class AuthorizationError(KafkaApiError):
    """The principal is not allowed to do this (topic, group or cluster authorization)."""


class UnsupportedVersionError(KafkaApiError):
    """The broker does not support a version of an API this module can speak."""

    default_hint = "Share-group administration needs Apache Kafka 4.1 or newer (4.2+ for GA)"


_ERROR_CLASSES: dict[int, type[KafkaApiError]] = {
    3: UnknownTopicError, 100: UnknownTopicError,
    14: CoordinatorNotAvailableError, 15: CoordinatorNotAvailableError,
    16: CoordinatorNotAvailableError,
    29: AuthorizationError, 30: AuthorizationError, 31: AuthorizationError,
    35: UnsupportedVersionError,
    68: GroupNotEmptyError,
    69: GroupNotFoundError,
}


def error_for(code: int, context: str, broker_message: str | None = None,
              hint: str | None = None) -> KafkaApiError:
    """The exception for a non-zero Kafka error code (the most specific subclass known)."""
    if code == 0:
        raise ValueError("error code 0 means success; there is no error to raise")
    cls = _ERROR_CLASSES.get(code, KafkaApiError)
    return cls(code, context, broker_message, hint)


def _check(code: int, context: str, broker_message: str | None = None) -> None:
    if code != 0:
        raise error_for(code, context, broker_message)


# -- primitive encoding ------------------------------------------------------------------------


class Writer:
    """Builds a request body. ``flexible`` selects compact strings/arrays."""

    def __init__(self, flexible: bool) -> None:
        self.flexible = flexible
        self._buf = bytearray()

    def getvalue(self) -> bytes:
        return bytes(self._buf)

    def int8(self, v: int) -> Writer:
        self._buf += struct.pack(">b", v)
        return self

    def int16(self, v: int) -> Writer:
        self._buf += struct.pack(">h", v)
        return self

    def int32(self, v: int) -> Writer:
        self._buf += struct.pack(">i", v)
        return self

    def int64(self, v: int) -> Writer:
        self._buf += struct.pack(">q", v)
        return self

    def boolean(self, v: bool) -> Writer:
        self._buf.append(1 if v else 0)
        return self

    def uvarint(self, v: int) -> Writer:
        if v < 0 or v > 0xFFFFFFFF:
            raise ValueError(f"unsigned varint out of range: {v}")
        while v >= 0x80:
            self._buf.append((v & 0x7F) | 0x80)
            v >>= 7
        self._buf.append(v)
        return self

    def _length(self, n: int | None) -> None:
        """A string/array length: compact (uvarint n+1, 0 = null) or classic."""
        if self.flexible:
            self.uvarint(0 if n is None else n + 1)
        else:
            self.int32(-1 if n is None else n)

    def string(self, v: str | None) -> Writer:
        """A (nullable) string: compact when flexible, else int16-length-prefixed."""
        data = None if v is None else v.encode("utf-8")
        if self.flexible:
            self.uvarint(0 if data is None else len(data) + 1)
        else:
            if data is not None and len(data) > 0x7FFF:
                raise ValueError("string too long for a classic Kafka string")
            self.int16(-1 if data is None else len(data))
        if data is not None:
            self._buf += data
        return self

    def array_header(self, n: int | None) -> Writer:
        """The length of a (nullable) array; its elements follow."""
        self._length(n)
        return self

    def string_array(self, values: Sequence[str] | None) -> Writer:
        self.array_header(None if values is None else len(values))
        for v in values or ():
            self.string(v)
        return self

    def int32_array(self, values: Sequence[int]) -> Writer:
        self.array_header(len(values))
        for v in values:
            self.int32(v)
        return self

    def tags(self) -> Writer:
        """An empty tagged-field section (flexible versions only; a no-op otherwise)."""
        if self.flexible:
            self.uvarint(0)
        return self


class Reader:
    """Reads a response body; every read is bounds-checked (:class:`ProtocolDecodeError`)."""

    def __init__(self, data: bytes, flexible: bool, offset: int = 0) -> None:
        self.data = data
        self.flexible = flexible
        self.pos = offset

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ProtocolDecodeError(
                f"truncated response: wanted {n} bytes at offset {self.pos} of {len(self.data)}"
            )
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def int8(self) -> int:
        return int(struct.unpack(">b", self._take(1))[0])

    def int16(self) -> int:
        return int(struct.unpack(">h", self._take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self._take(4))[0])

    def int64(self) -> int:
        return int(struct.unpack(">q", self._take(8))[0])

    def boolean(self) -> bool:
        return self._take(1) != b"\x00"

    def uvarint(self) -> int:
        value = 0
        for shift in range(0, 35, 7):
            b = self._take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                if value > 0xFFFFFFFF:
                    break
                return value
        raise ProtocolDecodeError(f"malformed unsigned varint ending at offset {self.pos}")

    def uuid(self) -> str:
        """A 16-byte UUID, as Kafka prints it (URL-safe base64 without padding)."""
        return base64.urlsafe_b64encode(self._take(16)).decode("ascii").rstrip("=")

    def nullable_string(self) -> str | None:
        n = self.uvarint() - 1 if self.flexible else self.int16()
        if n < 0:
            return None
        try:
            return self._take(n).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolDecodeError(f"string is not UTF-8 at offset {self.pos}") from exc

    def string(self) -> str:
        v = self.nullable_string()
        if v is None:
            raise ProtocolDecodeError(f"unexpected null string before offset {self.pos}")
        return v

    def array_length(self) -> int:
        """An array's length; null arrays read as 0 (no field decoded here is null in practice)."""
        n = self.uvarint() - 1 if self.flexible else self.int32()
        if n > self.remaining():  # every element takes at least one byte
            raise ProtocolDecodeError(f"array length {n} exceeds the remaining response")
        return max(n, 0)

    def string_array(self) -> tuple[str, ...]:
        return tuple(self.string() for _ in range(self.array_length()))

    def int32_array(self) -> tuple[int, ...]:
        return tuple(self.int32() for _ in range(self.array_length()))

    def skip_tags(self) -> None:
        """Skip a tagged-field section (flexible versions only; no-op otherwise)."""
        if not self.flexible:
            return
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self._take(self.uvarint())

    def expect_end(self, what: str) -> None:
        if self.remaining():
            raise ProtocolDecodeError(f"{self.remaining()} unexpected trailing bytes in {what}")


def is_flexible(api_key: int, version: int) -> bool:
    return version >= API_SPECS[api_key].flexible_from


# -- headers -----------------------------------------------------------------------------------


def encode_request_header(api_key: int, version: int, correlation_id: int,
                          client_id: str | None) -> bytes:
    """RequestHeader v2 for flexible requests, else v1. ClientId is always a classic string."""
    w = Writer(flexible=False).int16(api_key).int16(version).int32(correlation_id)
    w.string(client_id)
    if is_flexible(api_key, version):
        w.uvarint(0)  # header tagged fields
    return w.getvalue()


def decode_response_header(api_key: int, version: int, r: Reader) -> int:
    """Read the ResponseHeader (v1 for flexible responses except ApiVersions, else v0)."""
    correlation_id = r.int32()
    if is_flexible(api_key, version) and api_key != API_VERSIONS:
        r.flexible = True
        r.skip_tags()
    return correlation_id


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
    start_offset: int
    leader_epoch: int
    lag: int | None  # None before v1 of DescribeShareGroupOffsets; -1 = unknown on v1+
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


def _writer(api_key: int, version: int) -> Writer:
    spec = API_SPECS[api_key]
    if not spec.min_version <= version <= spec.max_version:
        raise ValueError(f"{spec.name} v{version} is not implemented "
                         f"(v{spec.min_version}-{spec.max_version} are)")
    return Writer(flexible=is_flexible(api_key, version))


def encode_api_versions_request(version: int = 0) -> bytes:
    return _writer(API_VERSIONS, version).getvalue()  # v0 has no fields


def decode_api_versions_response(version: int, r: Reader) -> tuple[int, dict[int, tuple[int, int]]]:
    """``(error_code, {api_key: (min, max)})``; UNSUPPORTED_VERSION still carries the list."""
    code = r.int16()
    out: dict[int, tuple[int, int]] = {}
    for _ in range(r.array_length()):
        key, lo, hi = r.int16(), r.int16(), r.int16()
        out[key] = (lo, hi)
    return code, out


def encode_metadata_request(version: int) -> bytes:
    """Metadata for no topics at all: just the brokers."""
    w = _writer(METADATA, version)
    w.array_header(0)  # Topics: empty (null would mean every topic)
    w.boolean(False)  # AllowAutoTopicCreation
    w.boolean(False)  # IncludeTopicAuthorizedOperations
    return w.tags().getvalue()


def decode_metadata_response(version: int, r: Reader) -> tuple[int, tuple[BrokerNode, ...]]:
    """``(error_code, brokers)``; the request asked for no topics."""
    r.int32()  # ThrottleTimeMs
    brokers = []
    for _ in range(r.array_length()):
        node, host, port = r.int32(), r.string(), r.int32()
        r.nullable_string()  # Rack
        r.skip_tags()
        brokers.append(BrokerNode(node, host, port))
    r.nullable_string()  # ClusterId
    r.int32()  # ControllerId
    if r.array_length():
        raise ProtocolDecodeError("Metadata response lists topics, but none were asked for")
    code = r.int16() if version >= 13 else 0
    r.skip_tags()
    return code, tuple(brokers)


def encode_find_coordinator_request(version: int, keys: Sequence[str],
                                    key_type: int = GROUP_KEY_TYPE) -> bytes:
    w = _writer(FIND_COORDINATOR, version)
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
    w = _writer(LIST_GROUPS, version)
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
    return _writer(DELETE_GROUPS, version).string_array(groups).tags().getvalue()


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


def encode_share_group_describe_request(version: int, groups: Sequence[str],
                                        include_authorized_operations: bool = False) -> bytes:
    w = _writer(SHARE_GROUP_DESCRIBE, version)
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
    w = _writer(DESCRIBE_SHARE_GROUP_OFFSETS, version)
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
                partitions.append(SharePartitionOffset(index, start, epoch, lag, code, message))
            r.skip_tags()
            topics.append(ShareTopicOffsets(topic, topic_id, tuple(partitions)))
        code, message = r.int16(), r.nullable_string()
        r.skip_tags()
        groups.append(ShareGroupOffsets(group_id, tuple(topics), code, message))
    r.skip_tags()
    return tuple(groups)


def encode_alter_share_group_offsets_request(
    version: int, group_id: str, offsets: Mapping[str, Mapping[int, int]]
) -> bytes:
    """``offsets``: ``{topic: {partition: new start offset}}``."""
    w = _writer(ALTER_SHARE_GROUP_OFFSETS, version)
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
    w = _writer(DELETE_SHARE_GROUP_OFFSETS, version)
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


# -- connections -------------------------------------------------------------------------------


def parse_bootstrap(servers: str) -> list[tuple[str, int]]:
    """``"h1:9092,PLAINTEXT://h2:9092,[::1]:9092"`` -> ``[(host, port), ...]``.

    Raises :class:`UnsupportedSecurityProtocolError` for a non-PLAINTEXT listener scheme.
    """
    out: list[tuple[str, int]] = []
    for raw in servers.split(","):
        item = raw.strip()
        if not item:
            continue
        if "://" in item:
            scheme, item = item.split("://", 1)
            check_security_protocol(scheme)
        host, sep, port_s = item.rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port_s.isdigit():
            raise OptionError("bootstrap_servers", servers,
                              "give a comma-separated list of host:port")
        out.append((host, int(port_s)))
    if not out:
        raise OptionError("bootstrap_servers", servers, "give at least one host:port")
    return out


def check_security_protocol(protocol: str) -> None:
    """Raise :class:`UnsupportedSecurityProtocolError` unless ``protocol`` is PLAINTEXT."""
    if protocol.strip().upper() != "PLAINTEXT":
        raise UnsupportedSecurityProtocolError(
            f"security protocol {protocol!r} is not supported by the share-group admin client, "
            "which speaks plaintext only (PLAINTEXT). Use Kafka's kafka-share-groups.sh tool "
            "for SSL/SASL clusters"
        )


class BrokerConnection:
    """One plaintext connection to one broker; requests are sent and answered one at a time."""

    def __init__(self, host: str, port: int, *, deadline: float,
                 client_id: str = "pyspark-kafka-share") -> None:
        self.host, self.port, self.client_id = host, port, client_id
        self._correlation = 0
        self.versions: dict[int, tuple[int, int]] = {}
        try:
            self._sock = socket.create_connection((host, port), timeout=_remaining(deadline))
        except OSError as exc:
            raise KafkaConnectionError(f"cannot connect to broker {host}:{port}: {exc}") from exc

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def close(self) -> None:
        self._sock.close()

    def negotiate(self, deadline: float) -> dict[int, tuple[int, int]]:
        """ApiVersions v0: learn (and remember) which API versions the broker supports."""
        r = self.send(API_VERSIONS, 0, encode_api_versions_request(0), deadline)
        code, versions = decode_api_versions_response(0, r)
        if code not in (0, 35):  # UNSUPPORTED_VERSION still lists the versions
            raise error_for(code, f"ApiVersions to {self.address}")
        self.versions = versions
        return versions

    def version_for(self, api_key: int) -> int:
        """The highest version both the broker (after :meth:`negotiate`) and this module speak."""
        spec = API_SPECS[api_key]
        lo, hi = self.versions.get(api_key, (-1, -1))
        best = min(hi, spec.max_version)
        if lo < 0 or best < max(lo, spec.min_version):
            theirs = "not at all" if lo < 0 else f"v{lo}-{hi}"
            raise UnsupportedVersionError(
                35, f"{spec.name} (API key {api_key}): the broker at {self.address} supports "
                f"it {theirs}; this client speaks v{spec.min_version}-{spec.max_version}",
                from_broker=False)
        return best

    def send(self, api_key: int, version: int, body: bytes, deadline: float) -> Reader:
        """Send one request, wait for its response; return a Reader positioned at the body."""
        self._correlation = (self._correlation + 1) & 0x7FFFFFFF
        corr = self._correlation
        header = encode_request_header(api_key, version, corr, self.client_id)
        payload = header + body
        name = API_SPECS[api_key].name
        try:
            self._sock.settimeout(_remaining(deadline))
            self._sock.sendall(struct.pack(">i", len(payload)) + payload)
            size = struct.unpack(">i", self._recv(4, deadline))[0]
            if not 0 <= size <= _MAX_FRAME:
                raise ProtocolDecodeError(f"{name} response from {self.address} has size {size}")
            data = self._recv(size, deadline)
        except TimeoutError as exc:
            raise KafkaConnectionError(
                f"{name} to {self.address}: no response within the timeout") from exc
        except OSError as exc:
            raise KafkaConnectionError(f"{name} to {self.address} failed: {exc}") from exc
        r = Reader(data, flexible=False)
        got = decode_response_header(api_key, version, r)
        if got != corr:
            raise ProtocolDecodeError(
                f"{name} to {self.address}: correlation id {got}, expected {corr}")
        r.flexible = is_flexible(api_key, version)
        return r

    def _recv(self, n: int, deadline: float) -> bytes:
        chunks: list[bytes] = []
        got = 0
        while got < n:
            self._sock.settimeout(_remaining(deadline))
            chunk = self._sock.recv(min(n - got, 1 << 20))
            if not chunk:
                raise KafkaConnectionError(f"broker {self.address} closed the connection")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise KafkaConnectionError("timed out")
    return left


def api_versions(host: str, port: int, timeout_s: float) -> dict[int, tuple[int, int]]:
    """ApiVersions v0 over a plain socket: ``{api_key: (min, max)}`` the broker supports."""
    conn = BrokerConnection(host, port, deadline=time.monotonic() + timeout_s)
    try:
        return conn.negotiate(time.monotonic() + timeout_s)
    finally:
        conn.close()


# -- the client --------------------------------------------------------------------------------


class KafkaProtocolClient:
    """Share-group admin requests over plaintext Kafka protocol, with bounded timeouts.

    Each public method finishes within ``timeout_s`` (or raises :class:`KafkaConnectionError`);
    coordinator moves (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
    COORDINATOR_LOAD_IN_PROGRESS) and lost connections are retried within that time.
    """

    def __init__(self, bootstrap_servers: str, *, timeout_s: float = 30.0,
                 client_id: str = "pyspark-kafka-share-admin",
                 security_protocol: str = "PLAINTEXT") -> None:
        check_security_protocol(security_protocol)
        if timeout_s <= 0:
            raise OptionError("timeout_s", timeout_s, "give a positive number of seconds")
        self.bootstrap = parse_bootstrap(bootstrap_servers)
        self.timeout_s = timeout_s
        self.client_id = client_id
        self._conns: dict[tuple[str, int], BrokerConnection] = {}
        self._coordinators: dict[str, tuple[str, int]] = {}

    def __enter__(self) -> KafkaProtocolClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close every socket. The client reconnects if used again."""
        conns, self._conns = self._conns, {}
        for conn in conns.values():
            conn.close()

    # -- plumbing --

    def _deadline(self) -> float:
        return time.monotonic() + self.timeout_s

    def _connection(self, host: str, port: int, deadline: float) -> BrokerConnection:
        conn = self._conns.get((host, port))
        if conn is None:
            conn = BrokerConnection(host, port, deadline=deadline, client_id=self.client_id)
            try:
                conn.negotiate(deadline)
            except BaseException:
                conn.close()
                raise
            self._conns[(host, port)] = conn
        return conn

    def _drop(self, conn: BrokerConnection) -> None:
        self._conns.pop((conn.host, conn.port), None)
        conn.close()

    def _any_connection(self, deadline: float) -> BrokerConnection:
        if self._conns:
            return next(iter(self._conns.values()))
        errors = []
        for host, port in self.bootstrap:
            try:
                return self._connection(host, port, deadline)
            except KafkaConnectionError as exc:
                errors.append(str(exc))
        raise KafkaConnectionError(
            f"no bootstrap server answered within {self.timeout_s:g}s: {'; '.join(errors)}")

    def _call(self, conn: BrokerConnection, api_key: int, encode: Callable[[int], bytes],
              decode: Callable[[int, Reader], T], deadline: float) -> T:
        version = conn.version_for(api_key)
        try:
            r = conn.send(api_key, version, encode(version), deadline)
        except BrokerError:
            self._drop(conn)  # the stream may be mid-frame: never reuse it
            raise
        result = decode(version, r)
        r.expect_end(f"{API_SPECS[api_key].name} v{version} response")
        return result

    def _retrying(self, deadline: float, what: str, attempt: Callable[[], T]) -> T:
        """Run ``attempt`` until it succeeds, retrying coordinator and connection errors."""
        backoff = 0.05
        while True:
            try:
                return attempt()
            except (CoordinatorNotAvailableError, KafkaConnectionError) as exc:
                if time.monotonic() + backoff >= deadline:
                    raise KafkaConnectionError(
                        f"{what}: gave up after {self.timeout_s:g}s; last error: {exc}") from exc
                time.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

    def _coordinated(self, group: str, api_key: int, encode: Callable[[int], bytes],
                     decode: Callable[[int, Reader], T], check: Callable[[T], None]) -> T:
        """Send a request to ``group``'s coordinator; ``check`` raises on group-level errors."""
        deadline = self._deadline()
        what = f"{API_SPECS[api_key].name} for group {group!r}"

        def attempt() -> T:
            conn = self._coordinator_connection(group, deadline)
            try:
                result = self._call(conn, api_key, encode, decode, deadline)
                check(result)
            except (CoordinatorNotAvailableError, KafkaConnectionError):
                self._coordinators.pop(group, None)
                raise
            return result

        return self._retrying(deadline, what, attempt)

    def _coordinator_connection(self, group: str, deadline: float) -> BrokerConnection:
        address = self._coordinators.get(group)
        if address is None:
            node = self._find_coordinator_once(group, deadline)
            address = (node.host, node.port)
            self._coordinators[group] = address
        return self._connection(*address, deadline)

    def _find_coordinator_once(self, group: str, deadline: float) -> BrokerNode:
        conn = self._any_connection(deadline)
        found = self._call(
            conn, FIND_COORDINATOR,
            lambda v: encode_find_coordinator_request(v, [group]),
            decode_find_coordinator_response, deadline)
        match = [c for c in found if c.key in (None, group)]
        if len(match) != 1:
            raise ProtocolDecodeError(f"FindCoordinator did not answer for group {group!r}")
        c = match[0]
        _check(c.error_code, f"FindCoordinator for group {group!r}", c.error_message)
        return BrokerNode(c.node_id, c.host, c.port)

    # -- APIs --

    def api_versions(self) -> dict[int, tuple[int, int]]:
        """The bootstrap broker's supported versions (ApiVersions v0)."""
        deadline = self._deadline()
        return dict(self._retrying(deadline, "ApiVersions",
                                   lambda: self._any_connection(deadline)).versions)

    def brokers(self) -> tuple[BrokerNode, ...]:
        """Every broker of the cluster (Metadata for no topics)."""
        deadline = self._deadline()

        def attempt() -> tuple[BrokerNode, ...]:
            conn = self._any_connection(deadline)
            code, nodes = self._call(conn, METADATA, encode_metadata_request,
                                     decode_metadata_response, deadline)
            _check(code, "Metadata")
            return nodes

        return self._retrying(deadline, "Metadata", attempt)

    def find_coordinator(self, group: str) -> BrokerNode:
        """The broker coordinating ``group`` (FindCoordinator, key type 0 = group)."""
        deadline = self._deadline()
        node = self._retrying(deadline, f"FindCoordinator for group {group!r}",
                              lambda: self._find_coordinator_once(group, deadline))
        self._coordinators[group] = (node.host, node.port)
        return node

    def list_groups(self, types: Sequence[str] = ("share",),
                    states: Sequence[str] = ()) -> list[ListedGroup]:
        """ListGroups v5 on every broker (each lists the groups it coordinates)."""
        deadline = self._deadline()
        seen: dict[str, ListedGroup] = {}
        for node in self.brokers():

            def attempt(node: BrokerNode = node) -> tuple[ListedGroup, ...]:
                conn = self._connection(node.host, node.port, deadline)
                code, groups = self._call(
                    conn, LIST_GROUPS,
                    lambda v: encode_list_groups_request(v, states=states, types=types),
                    decode_list_groups_response, deadline)
                _check(code, f"ListGroups on broker {node.host}:{node.port}")
                return groups

            for g in self._retrying(deadline, "ListGroups", attempt):
                seen[g.group_id] = g
        return sorted(seen.values(), key=lambda g: g.group_id)

    def describe_share_group(self, group: str) -> DescribedShareGroup:
        """ShareGroupDescribe for one group; raises for group-level errors."""

        def check(result: tuple[DescribedShareGroup, ...]) -> None:
            if len(result) != 1 or result[0].group_id != group:
                raise ProtocolDecodeError(f"ShareGroupDescribe did not answer for {group!r}")
            _check(result[0].error_code, f"describing share group {group!r}",
                   result[0].error_message)

        return self._coordinated(
            group, SHARE_GROUP_DESCRIBE,
            lambda v: encode_share_group_describe_request(v, [group]),
            decode_share_group_describe_response, check)[0]

    def describe_share_group_offsets(
        self, group: str, topics: Mapping[str, Sequence[int]] | None = None
    ) -> ShareGroupOffsets:
        """DescribeShareGroupOffsets for one group (``topics=None``: every partition)."""

        def check(result: tuple[ShareGroupOffsets, ...]) -> None:
            if len(result) != 1 or result[0].group_id != group:
                raise ProtocolDecodeError(
                    f"DescribeShareGroupOffsets did not answer for {group!r}")
            _check(result[0].error_code, f"describing the offsets of share group {group!r}",
                   result[0].error_message)

        return self._coordinated(
            group, DESCRIBE_SHARE_GROUP_OFFSETS,
            lambda v: encode_describe_share_group_offsets_request(v, {group: topics}),
            decode_describe_share_group_offsets_response, check)[0]

    def alter_share_group_offsets(self, group: str,
                                  offsets: Mapping[str, Mapping[int, int]]) -> AlterOffsetsResult:
        """AlterShareGroupOffsets; raises for group-level errors (:class:`GroupNotEmptyError`)."""

        def check(result: AlterOffsetsResult) -> None:
            _check(result.error_code, f"altering the offsets of share group {group!r}",
                   result.error_message)

        return self._coordinated(
            group, ALTER_SHARE_GROUP_OFFSETS,
            lambda v: encode_alter_share_group_offsets_request(v, group, offsets),
            decode_alter_share_group_offsets_response, check)

    def delete_share_group_offsets(self, group: str,
                                   topics: Sequence[str]) -> DeleteOffsetsResult:
        """DeleteShareGroupOffsets; raises for group-level errors."""

        def check(result: DeleteOffsetsResult) -> None:
            _check(result.error_code, f"deleting the offsets of share group {group!r}",
                   result.error_message)

        return self._coordinated(
            group, DELETE_SHARE_GROUP_OFFSETS,
            lambda v: encode_delete_share_group_offsets_request(v, group, topics),
            decode_delete_share_group_offsets_response, check)

    def delete_group(self, group: str) -> None:
        """DeleteGroups for one group; raises :class:`GroupNotEmptyError` etc."""

        def check(result: dict[str, int]) -> None:
            if group not in result:
                raise ProtocolDecodeError(f"DeleteGroups did not answer for {group!r}")
            _check(result[group], f"deleting group {group!r}")

        self._coordinated(group, DELETE_GROUPS,
                          lambda v: encode_delete_groups_request(v, [group]),
                          decode_delete_groups_response, check)


def iter_partitions(offsets: ShareGroupOffsets) -> Iterable[tuple[str, SharePartitionOffset]]:
    """``(topic, partition offset)`` pairs of a DescribeShareGroupOffsets result."""
    for topic in offsets.topics:
        for p in topic.partitions:
            yield topic.topic, p
