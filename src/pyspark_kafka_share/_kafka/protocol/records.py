"""Record-batch v2 decoding (magic 2, Kafka 0.11+): CRC-32C checked, every compression codec
Kafka producers write (gzip, snappy raw or xerial-framed, lz4 frame, zstd).

The layout, per Kafka's message-format documentation::

    baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic int8 (2),
    crc uint32 (CRC-32C of everything from attributes to the batch's end),
    attributes int16 (bits 0-2 codec, 3 timestamp type, 4 transactional, 5 control),
    lastOffsetDelta int32, baseTimestamp int64, maxTimestamp int64, producerId int64,
    producerEpoch int16, baseSequence int32, recordCount int32, records...

and each record: ``length varint, attributes int8, timestampDelta varlong, offsetDelta varint,
key (varint length, -1 null), value (same), headers (varint count; key string, value bytes)``,
where every varint is zigzag-encoded. The records after ``recordCount`` are compressed as a
whole when the codec bits say so. Codecs come from maintained wheels: ``gzip`` from the
standard library, snappy/lz4/zstd from ``cramjam`` (one wheel, no system library), the CRC
from ``crc32c`` (hardware-accelerated where the CPU has it); see docs/design.md.
"""

from __future__ import annotations

import gzip
import struct
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import cramjam
import numpy as np
import numpy.typing as npt
from crc32c import crc32c

from pyspark_kafka_share.errors import ProtocolDecodeError

__all__ = ["CODECS", "Columns", "Record", "RecordBatch", "decode_batches"]

_HEAD = struct.Struct(">qiibIhiqqqhii")
"""baseOffset ... recordCount: 61 bytes."""
_CRC_FROM = 21  # the CRC covers the batch from the attributes on
_LENGTH_FROM = 12  # batchLength counts the bytes after itself
_XERIAL = b"\x82SNAPPY\x00"
_TIMESTAMP_LOG_APPEND = 0x08
_TRANSACTIONAL = 0x10
_CONTROL = 0x20


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a batch. ``timestamp_ms``: CreateTime, or the broker's LogAppendTime when
    ``log_append_time``; ``headers``: ``(key, value)`` pairs in order."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(slots=True)
class Columns:
    """Decoded records column by column: what the one parse loop (:func:`_parse`) writes, so
    that a fetch can become Arrow columns without an object per record. ``offsets`` and
    ``timestamps`` are machine integers (``array('q')``); ``keys``/``values`` the payloads;
    ``headers`` one tuple per record (the shared empty tuple when it has none)."""

    offsets: array[int] = field(default_factory=lambda: array("q"))
    timestamps: array[int] = field(default_factory=lambda: array("q"))
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    headers: list[tuple[tuple[str, bytes | None], ...]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.offsets)


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """One decoded batch. ``last_offset``: the offset its producer gave the last record (a
    compacted batch can hold fewer records than ``last_offset - base_offset + 1``). Its
    records are rows ``start .. stop - 1`` of ``columns`` (shared by a fetch's batches)."""

    base_offset: int
    last_offset: int
    leader_epoch: int
    codec: str
    log_append_time: bool
    transactional: bool
    control: bool
    producer_id: int
    columns: Columns
    start: int
    stop: int

    @property
    def records(self) -> tuple[Record, ...]:
        """The batch's records as objects (the per-record path)."""
        c = self.columns
        return tuple(Record(c.offsets[i], c.timestamps[i], c.keys[i], c.values[i],
                            c.headers[i]) for i in range(self.start, self.stop))


def _xerial_or_raw_snappy(data: bytes) -> bytes:
    """The Java producer frames snappy as xerial's stream (a header, then length-prefixed raw
    blocks); librdkafka writes one raw block. Both are read."""
    if not data.startswith(_XERIAL):
        return bytes(cramjam.snappy.decompress_raw(data))
    out, pos = bytearray(), 16  # magic (8), version (4), compatible version (4)
    while pos < len(data):
        if pos + 4 > len(data):
            raise ProtocolDecodeError("truncated xerial snappy block length")
        (size,) = struct.unpack_from(">i", data, pos)
        pos += 4
        out += bytes(cramjam.snappy.decompress_raw(data[pos:pos + size]))
        pos += size
    return bytes(out)


CODECS: dict[int, tuple[str, Callable[[bytes], bytes]]] = {
    0: ("none", bytes),
    1: ("gzip", gzip.decompress),
    2: ("snappy", _xerial_or_raw_snappy),
    3: ("lz4", lambda data: bytes(cramjam.lz4.decompress(data))),
    4: ("zstd", lambda data: bytes(cramjam.zstd.decompress(data))),
}
"""Kafka's codec ids (attribute bits 0-2): ``{id: (name, decompress)}``."""


def decode_batches(data: bytes, *, check_crc: bool = True,
                   columns: Columns | None = None) -> list[RecordBatch]:
    """Every complete batch in ``data`` (a fetch response's Records); a partial batch at the
    end (the broker cuts at its byte limit) is left out. Their records go to ``columns`` (a
    new one unless given), in order. :class:`ProtocolDecodeError` for a CRC mismatch, a
    magic other than 2, an unknown codec or a malformed record."""
    cols = Columns() if columns is None else columns
    heads: list[tuple[int, ...]] = []
    bodies: list[_Body] = []
    pos, end = 0, len(data)
    while pos + _HEAD.size <= end:
        head = _HEAD.unpack_from(data, pos)
        batch_end = pos + _LENGTH_FROM + head[1]
        if batch_end > end:
            break  # a partial batch: the fetch's byte limit cut it
        if head[3] != 2:
            raise ProtocolDecodeError(f"record batch at offset {head[0]} has magic {head[3]}; "
                                      "only magic 2 (Kafka 0.11+) is read")
        if check_crc and crc32c(memoryview(data)[pos + _CRC_FROM:batch_end]) != head[4]:
            raise ProtocolDecodeError(f"record batch at offset {head[0]}: CRC-32C mismatch")
        heads.append(head)
        bodies.append(_body(head, data[pos + _HEAD.size:batch_end]))
        pos = batch_end
    start = len(cols)
    if not _parse_columns(bodies, cols):  # all at once, else batch by batch
        for body in bodies:
            if not _parse_columns([body], cols):
                _parse(body.data, body.records, body.base_offset, body.base_ts,
                       log_append_ts=body.log_append_ts, cols=cols)
    out = []
    for head, body in zip(heads, bodies, strict=True):
        out.append(_batch(head, cols, start))
        start += body.records
    return out


class _Body(NamedTuple):
    """A batch's records (decompressed) and the bases of their offsets and timestamps."""

    data: bytes
    records: int
    base_offset: int
    base_ts: int
    log_append_ts: int | None  # every record's timestamp (LogAppendTime), or None


def _body(head: tuple[int, ...], data: bytes) -> _Body:
    base_offset, attributes, base_ts, max_ts, count = (head[0], head[5], head[7], head[8],
                                                       head[12])
    if count < 0:
        raise ProtocolDecodeError(f"record batch at offset {base_offset}: a record count of "
                                  f"{count}")
    codec = CODECS.get(attributes & 0x07)
    if codec is None:
        raise ProtocolDecodeError(f"record batch at offset {base_offset}: unknown codec "
                                  f"{attributes & 0x07}")
    name, decompress = codec
    if name != "none":
        try:
            data = decompress(data)
        except (OSError, ValueError, EOFError, cramjam.DecompressionError) as exc:
            raise ProtocolDecodeError(
                f"record batch at offset {base_offset}: {name} data is corrupt: {exc}") from exc
    log_append = bool(attributes & _TIMESTAMP_LOG_APPEND)
    return _Body(data, count, base_offset, base_ts, max_ts if log_append else None)


def _batch(head: tuple[int, ...], cols: Columns, start: int) -> RecordBatch:
    (base_offset, _length, epoch, _magic, _crc, attributes, last_delta, _base_ts, _max_ts,
     producer_id, _pepoch, _seq, count) = head
    return RecordBatch(base_offset, base_offset + last_delta, epoch,
                       CODECS[attributes & 0x07][0], bool(attributes & _TIMESTAMP_LOG_APPEND),
                       bool(attributes & _TRANSACTIONAL), bool(attributes & _CONTROL),
                       producer_id, cols, start, start + count)


_NO_HEADERS: tuple[tuple[str, bytes | None], ...] = ()


def _parse_columns(bodies: Sequence[_Body], cols: Columns) -> bool:
    """:func:`_parse` for batches of records without headers (the common case), a field at
    a time over all their records with numpy (a fetch's batches at once: numpy's cost per call
    is paid per field, not per batch); only the record boundaries are found in a loop. False,
    with ``cols`` untouched, when it does not read them all: a record with headers, or
    anything malformed (which :func:`_parse` then names)."""
    if not bodies:
        return True
    joined = bodies[0].data if len(bodies) == 1 else b"".join(b.data for b in bodies)
    buf = np.frombuffer(joined, dtype=np.uint8)
    bounds = _boundaries(joined, buf, bodies)
    if bounds is None:
        return False
    starts, lengths = bounds
    fields, data_at = [], []
    pos = starts + 1  # record attributes: unused
    for _ in range(4):  # timestamp delta, offset delta, key length, value length
        got = _varints(buf, pos)
        if got is None:
            return False
        value, pos = got
        fields.append(value)
        if len(fields) >= 3:  # a key or value: its bytes follow (a length of -1: null)
            data_at.append(pos)
            pos = pos + np.maximum(value, 0)
    ts_delta, off_delta, key_len, value_len = fields
    if (pos.size and int(pos.max()) >= len(joined)) or buf[pos].any() \
            or not np.array_equal(pos + 1, starts + lengths):
        return False  # past the end, headers (a count other than 0), or a wrong length
    counts = [b.records for b in bodies]

    def each(values: list[int]) -> npt.NDArray[np.int64]:  # a batch's value per record
        return np.repeat(np.array(values, dtype=np.int64), counts)

    stamps, offsets = (_sum(each([b.base_ts for b in bodies]), ts_delta),
                       _sum(each([b.base_offset for b in bodies]), off_delta))
    if stamps is None or offsets is None:
        return False  # past 64 bits: the loop says so
    if any(b.log_append_ts is not None for b in bodies):
        stamps = np.where(each([b.log_append_ts is not None for b in bodies]) != 0,
                          each([b.log_append_ts or 0 for b in bodies]), stamps)
    cols.offsets.frombytes(offsets.tobytes())
    cols.timestamps.frombytes(stamps.astype(np.int64).tobytes())
    cols.keys.extend(_slices(joined, data_at[0], key_len))
    cols.values.extend(_slices(joined, data_at[1], value_len))
    cols.headers.extend([_NO_HEADERS] * sum(counts))
    return True


def _sum(a: npt.NDArray[np.int64], b: npt.NDArray[np.int64]) -> npt.NDArray[np.int64] | None:
    """``a + b``, or None where a sum wraps past 64 bits (numpy would wrap silently)."""
    total = a + b
    return None if bool((((a ^ total) & (b ^ total)) < 0).any()) else total


def _boundaries(joined: bytes, buf: npt.NDArray[np.uint8], bodies: Sequence[_Body]
                ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """Where each record of ``bodies`` (one after the other in ``joined``) starts, after its
    length varint, and its length; None unless each batch's records fill it exactly. The
    loop only jumps from record to record."""
    marks = array("q")
    pos = 0
    try:
        for body in bodies:
            end = pos + len(body.data)
            for _ in range(body.records):
                marks.append(pos)
                b = joined[pos]
                if b < 0x80:
                    pos += 1 + ((b >> 1) ^ -(b & 1))
                elif joined[pos + 1] < 0x80:  # two bytes: a record of 64 to 8,191 bytes
                    v = (b & 0x7F) | (joined[pos + 1] << 7)
                    pos += 2 + ((v >> 1) ^ -(v & 1))
                else:
                    length, pos = _varint(joined, pos)
                    pos += length
            if pos != end:
                return None
    except (IndexError, ProtocolDecodeError):
        return None
    at = np.frombuffer(marks, dtype=np.int64)
    got = _varints(buf, at)
    if got is None:
        return None
    lengths, starts = got
    ends = np.append(at[1:], len(joined))
    if not (np.all(lengths >= 2) and np.array_equal(starts + lengths, ends)):
        return None  # attributes and at least one field each, one after the other
    return starts, lengths


def _varints(buf: npt.NDArray[np.uint8], pos: npt.NDArray[np.int64]
             ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """The zigzag varints at each of ``pos`` (at most 10 bytes, as :func:`_varint` reads):
    ``(values, next positions)``; None when one runs past ``buf`` or is longer."""
    value = np.zeros(len(pos), dtype=np.uint64)
    after = pos.copy()
    todo, at = np.arange(len(pos)), pos
    for shift in range(0, 70, 7):
        if not todo.size:
            break
        if int(at.max()) >= len(buf):
            return None
        byte = buf[at].astype(np.uint64)
        if shift == 63 and bool((byte & np.uint64(0x7E)).any()):
            return None  # a value past 64 bits (the loop names it)
        value[todo] |= (byte & np.uint64(0x7F)) << np.uint64(shift)
        more = byte >= 0x80
        after[todo[~more]] = at[~more] + 1
        todo, at = todo[more], at[more] + 1
    if todo.size:
        return None
    signed = (value >> np.uint64(1)) ^ (np.uint64(0) - (value & np.uint64(1)))
    return signed.view(np.int64), after


def _slices(body: bytes, starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]
            ) -> list[bytes | None]:
    """``body``'s bytes of the given lengths from ``starts`` (a negative length: None)."""
    ends = starts + np.maximum(lengths, 0)
    out: list[bytes | None] = [body[s:e] for s, e in
                               zip(starts.tolist(), ends.tolist(), strict=True)]
    for i in np.flatnonzero(lengths < 0).tolist():
        out[i] = None
    return out


def _parse(body: bytes, count: int, base_offset: int, base_ts: int, *,
           log_append_ts: int | None, cols: Columns) -> None:
    """``count`` records from ``body`` into ``cols``; each record's own length is checked.
    The one-byte varints (most of a record's) are read inline: a call per field was most of
    the decoding time."""
    offsets, stamps, keys, values, headers = (cols.offsets, cols.timestamps, cols.keys,
                                              cols.values, cols.headers)
    pos = 0
    try:
        for _ in range(count):
            length, pos = _varint(body, pos)
            start = pos
            pos += 1  # record attributes: unused
            b = body[pos]
            if b < 0x80:
                ts_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                ts_delta, pos = _varint(body, pos)
            b = body[pos]
            if b < 0x80:
                off_delta, pos = (b >> 1) ^ -(b & 1), pos + 1
            else:
                off_delta, pos = _varint(body, pos)
            key, pos = _bytes(body, pos)
            value, pos = _bytes(body, pos)
            if body[pos] == 0:  # no headers (varint 0)
                pos += 1
                hs = _NO_HEADERS
            else:
                hs, pos = _headers(body, pos)
            if pos != start + length:
                raise ProtocolDecodeError(f"record {base_offset + off_delta}: length {length} "
                                          f"does not match its fields")
            offsets.append(base_offset + off_delta)
            stamps.append(base_ts + ts_delta if log_append_ts is None else log_append_ts)
            keys.append(key)
            values.append(value)
            headers.append(hs)
    except (IndexError, UnicodeDecodeError, OverflowError) as exc:  # past 64 bits too
        raise ProtocolDecodeError(f"malformed record in batch {base_offset}: {exc}") from exc
    if pos != len(body):
        raise ProtocolDecodeError(f"batch {base_offset}: {len(body) - pos} bytes after its "
                                  f"{count} records")


def _headers(body: bytes, pos: int) -> tuple[tuple[tuple[str, bytes | None], ...], int]:
    n_headers, pos = _varint(body, pos)
    out = []
    for _ in range(n_headers):
        hkey, pos = _bytes(body, pos)
        hvalue, pos = _bytes(body, pos)
        out.append(((hkey or b"").decode("utf-8"), hvalue))
    return tuple(out), pos


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint (int32 or int64) at ``pos``: ``(value, next position)``."""
    b = data[pos]
    pos += 1
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos
    value, shift = b & 0x7F, 7
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return (value >> 1) ^ -(value & 1), pos
        shift += 7
        if shift > 63:
            raise ProtocolDecodeError(f"varint longer than 10 bytes before {pos}")


def _bytes(data: bytes, pos: int) -> tuple[bytes | None, int]:
    """Varint-length-prefixed bytes (-1: null) at ``pos``."""
    n, pos = _varint(data, pos)
    if n < 0:
        return None, pos
    if pos + n > len(data):
        raise ProtocolDecodeError(f"field of {n} bytes runs past its record at {pos}")
    return data[pos:pos + n], pos + n
