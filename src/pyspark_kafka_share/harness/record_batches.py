"""Kafka record batches (format v2) encoded in Python, for the decoder's tests and benchmark:
what a broker's ShareFetch answer carries, built without a broker."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

from crc32c import crc32c

__all__ = ["Header", "batch", "record", "zigzag"]

Header = tuple[str, bytes | None]


def zigzag(v: int) -> bytes:
    """``v`` as a zigzag varint (a record's signed fields)."""
    u = (v << 1) ^ (v >> 63)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def _field(data: bytes | None) -> bytes:
    return zigzag(-1) if data is None else zigzag(len(data)) + data


def record(delta: int, ts_delta: int, key: bytes | None, value: bytes | None,
           headers: Sequence[Header] = ()) -> bytes:
    """One record of a batch: its offset and timestamp deltas, key, value and headers."""
    body = b"\x00" + zigzag(ts_delta) + zigzag(delta) + _field(key) + _field(value)
    body += zigzag(len(headers))
    for hkey, hvalue in headers:
        body += _field(hkey.encode()) + _field(hvalue)
    return zigzag(len(body)) + body


def batch(base: int, records: Sequence[bytes], *, codec: int = 0,
          compress: Callable[[bytes], bytes] | None = None, attributes: int = 0,
          base_ts: int = 1_000, max_ts: int = 2_000, magic: int = 2) -> bytes:
    """A batch of ``records`` from offset ``base``, compressed by ``compress`` (``codec``:
    the attributes' codec bits), its CRC-32C computed."""
    payload = b"".join(records)
    if compress is not None:
        payload = compress(payload)
    after_crc = struct.pack(">hiqqqhii", codec | attributes, len(records) - 1, base_ts, max_ts,
                            -1, -1, -1, len(records)) + payload
    head = struct.pack(">ib", 0, magic)  # partitionLeaderEpoch, magic
    crc = struct.pack(">I", crc32c(after_crc))
    rest = head + crc + after_crc
    return struct.pack(">qi", base, len(rest)) + rest
