"""Kafka wire-protocol encoding: API keys and the versions implemented, primitive types
(big-endian ints, unsigned varints, classic and compact strings/arrays, UUIDs, tagged fields),
request/response headers and a connection's correlation ids (:class:`Framer`). Pure
functions and buffers; I/O only through the caller's ``roundtrip``."""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TypeVar

from pyspark_kafka_share.errors import ProtocolDecodeError

T = TypeVar("T")

MAX_FRAME = 64 * 1024 * 1024
"""The largest response frame accepted (bytes)."""

# -- API keys and the versions this module implements ------------------------------------------

class ApiKey(IntEnum):
    """Kafka API keys: those this module speaks (:data:`API_SPECS`) and those whose support
    the broker checks look for (ShareGroupHeartbeat, ShareFetch)."""

    METADATA = 3
    FIND_COORDINATOR = 10
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    SASL_AUTHENTICATE = 36
    DELETE_GROUPS = 42
    SHARE_GROUP_HEARTBEAT = 76
    SHARE_GROUP_DESCRIBE = 77
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79
    DESCRIBE_SHARE_GROUP_OFFSETS = 90
    ALTER_SHARE_GROUP_OFFSETS = 91
    DELETE_SHARE_GROUP_OFFSETS = 92


@dataclass(frozen=True)
class _ApiSpec:
    name: str
    min_version: int
    max_version: int
    flexible_from: int  # first flexible version (NEVER: none is)


NEVER = 1 << 15
"""``flexible_from`` of an API with no flexible version."""


API_SPECS: dict[ApiKey, _ApiSpec] = {
    ApiKey.API_VERSIONS: _ApiSpec("ApiVersions", 0, 4, 3),
    ApiKey.METADATA: _ApiSpec("Metadata", 11, 13, 9),
    ApiKey.FIND_COORDINATOR: _ApiSpec("FindCoordinator", 3, 6, 3),
    ApiKey.LIST_GROUPS: _ApiSpec("ListGroups", 5, 5, 3),
    ApiKey.SASL_HANDSHAKE: _ApiSpec("SaslHandshake", 1, 1, NEVER),
    ApiKey.SASL_AUTHENTICATE: _ApiSpec("SaslAuthenticate", 0, 2, 2),
    ApiKey.DELETE_GROUPS: _ApiSpec("DeleteGroups", 0, 2, 2),
    ApiKey.SHARE_GROUP_HEARTBEAT: _ApiSpec("ShareGroupHeartbeat", 1, 1, 0),
    ApiKey.SHARE_FETCH: _ApiSpec("ShareFetch", 1, 2, 0),
    ApiKey.SHARE_ACKNOWLEDGE: _ApiSpec("ShareAcknowledge", 1, 2, 0),
    ApiKey.SHARE_GROUP_DESCRIBE: _ApiSpec("ShareGroupDescribe", 1, 1, 0),
    ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS: _ApiSpec("DescribeShareGroupOffsets", 0, 1, 0),
    ApiKey.ALTER_SHARE_GROUP_OFFSETS: _ApiSpec("AlterShareGroupOffsets", 0, 0, 0),
    ApiKey.DELETE_SHARE_GROUP_OFFSETS: _ApiSpec("DeleteShareGroupOffsets", 0, 0, 0),
}
"""What this module implements: ``{api_key: spec}``."""

GROUP_KEY_TYPE = 0
"""FindCoordinator ``KeyType`` for groups (consumer and share groups alike)."""


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

    def uuid(self, v: str) -> Writer:
        """A UUID given as Kafka prints it (URL-safe base64 without padding)."""
        raw = base64.urlsafe_b64decode(v + "=" * (-len(v) % 4))
        if len(raw) != 16:
            raise ValueError(f"not a Kafka UUID: {v!r}")
        self._buf += raw
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

    def nullable_bytes(self) -> bytes | None:
        """Compact (nullable) bytes or records: uvarint length + 1, 0 for null (flexible
        versions only; the fetch APIs that carry records are all flexible)."""
        n = self.uvarint() - 1
        return None if n < 0 else self._take(n)

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

    def skip_rest(self) -> None:
        """Skip what is left of the message (fields a caller does not read)."""
        self.pos = len(self.data)

    def expect_end(self, what: str) -> None:
        if self.remaining():
            raise ProtocolDecodeError(f"{self.remaining()} unexpected trailing bytes in {what}")


def is_flexible(api_key: ApiKey, version: int) -> bool:
    return version >= API_SPECS[api_key].flexible_from


def request_writer(api_key: ApiKey, version: int) -> Writer:
    """A :class:`Writer` for a v``version`` request body of ``api_key`` (flexible as that
    version is); ``ValueError`` for a version this module does not implement."""
    spec = API_SPECS[api_key]
    if not spec.min_version <= version <= spec.max_version:
        raise ValueError(f"{spec.name} v{version} is not implemented "
                         f"(v{spec.min_version}-{spec.max_version} are)")
    return Writer(flexible=is_flexible(api_key, version))


def common_version(api_key: ApiKey, theirs: tuple[int, int] | None) -> int | None:
    """The highest version of ``api_key`` that both this module (:data:`API_SPECS`) and a
    broker offering ``theirs`` (its ApiVersions ``(min, max)``) speak; ``None`` when there is
    none, or when ``theirs`` is no valid range (missing, negative, or min above max): a range
    that makes no sense is never trusted to pick a schema."""
    spec = API_SPECS[api_key]
    if theirs is None:
        return None
    lo, hi = theirs
    if lo < 0 or hi < lo:
        return None
    best = min(hi, spec.max_version)
    return best if best >= max(lo, spec.min_version) else None


# -- headers -----------------------------------------------------------------------------------


def encode_request_header(api_key: ApiKey, version: int, correlation_id: int,
                          client_id: str | None) -> bytes:
    """RequestHeader v2 for flexible requests, else v1. ClientId is always a classic string."""
    w = Writer(flexible=False).int16(api_key).int16(version).int32(correlation_id)
    w.string(client_id)
    if is_flexible(api_key, version):
        w.uvarint(0)  # header tagged fields
    return w.getvalue()


def decode_response_header(api_key: ApiKey, version: int, r: Reader) -> int:
    """Read the ResponseHeader (v1 for flexible responses except ApiVersions, else v0)."""
    correlation_id = r.int32()
    if is_flexible(api_key, version) and api_key != ApiKey.API_VERSIONS:
        r.flexible = True
        r.skip_tags()
    return correlation_id



Roundtrip = Callable[[str, bytes, float], bytes]
"""Send one request frame (header + body) by the deadline, return the response frame."""


class Framer:
    """Headers and correlation ids of one connection: every request on it, SASL's included,
    takes the next id of one sequence and must be answered with it."""

    def __init__(self, client_id: str | None, address: str) -> None:
        self.client_id, self.address = client_id, address
        self.correlation = 0

    def send(self, roundtrip: Roundtrip, api_key: ApiKey, version: int, body: bytes,
             deadline: float) -> Reader:
        """Send request ``body`` through ``roundtrip``; a Reader positioned at the response's
        body (flexible as the version is)."""
        self.correlation = (self.correlation + 1) & 0x7FFFFFFF
        corr = self.correlation
        name = API_SPECS[api_key].name
        header = encode_request_header(api_key, version, corr, self.client_id)
        r = Reader(roundtrip(name, header + body, deadline), flexible=False)
        got = decode_response_header(api_key, version, r)
        if got != corr:
            raise ProtocolDecodeError(
                f"{name} to {self.address}: correlation id {got}, expected {corr}")
        r.flexible = is_flexible(api_key, version)
        return r
