"""Record-batch v2 decoding (``_kafka/protocol/records.py``) on batches built here byte by
byte, as Kafka's message-format documentation lays them out; the batches real producers
write (librdkafka, the Java producer) are decoded in tests/integration/test_native_consumer.py.
"""

from __future__ import annotations

import gzip
import random
import struct

import cramjam
import pytest

from pyspark_kafka_share._kafka.protocol.records import (
    Columns,
    RecordBatch,
    _Body,
    _parse,
    _parse_columns,
    decode_batches,
)
from pyspark_kafka_share.errors import ProtocolDecodeError
from pyspark_kafka_share.harness import record_batches as rb


def _xerial(data: bytes) -> bytes:
    """Snappy framed as xerial's stream, as the Java producer writes it (two blocks)."""
    half = len(data) // 2
    out = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for chunk in (data[:half], data[half:]):
        block = bytes(cramjam.snappy.compress_raw(chunk))
        out += struct.pack(">i", len(block)) + block
    return out


RECORDS = [rb.record(0, 0, b"k0", b"v0", (("h", b"x"), ("n", None))),
           rb.record(1, 5, None, b"v1"),
           rb.record(2, -3, b"k2", None)]

CODECS = {
    "gzip": (1, gzip.compress),
    "snappy": (2, lambda d: bytes(cramjam.snappy.compress_raw(d))),
    "snappy-xerial": (2, _xerial),
    "lz4": (3, lambda d: bytes(cramjam.lz4.compress(d))),
    "zstd": (4, lambda d: bytes(cramjam.zstd.compress(d))),
}


def test_an_uncompressed_batch_is_read_field_by_field() -> None:
    (batch,) = decode_batches(rb.batch(100, RECORDS))
    assert (batch.base_offset, batch.last_offset, batch.codec) == (100, 102, "none")
    got = [(r.offset, r.timestamp_ms, r.key, r.value, r.headers) for r in batch.records]
    assert got == [(100, 1_000, b"k0", b"v0", (("h", b"x"), ("n", None))),
                   (101, 1_005, None, b"v1", ()),
                   (102, 997, b"k2", None, ())]


@pytest.mark.parametrize("name", sorted(CODECS))
def test_each_codec_decodes_to_the_same_records(name: str) -> None:
    codec, compress = CODECS[name]
    plain = decode_batches(rb.batch(7, RECORDS))[0].records
    (batch,) = decode_batches(rb.batch(7, RECORDS, codec=codec, compress=compress))
    assert batch.records == plain
    assert batch.codec == name.split("-", maxsplit=1)[0]


def test_log_append_time_gives_every_record_the_batch_timestamp() -> None:
    (batch,) = decode_batches(rb.batch(0, RECORDS, attributes=0x08, max_ts=9_999))
    assert batch.log_append_time
    assert {r.timestamp_ms for r in batch.records} == {9_999}


def test_a_crc_mismatch_is_an_error_unless_unchecked() -> None:
    data = bytearray(rb.batch(0, RECORDS))
    data[-3] ^= 0x01  # the last record's key, b"k2" -> b"k3": covered by the CRC
    with pytest.raises(ProtocolDecodeError, match="CRC-32C mismatch"):
        decode_batches(bytes(data))
    (batch,) = decode_batches(bytes(data), check_crc=False)
    assert batch.records[-1].key == b"k3"


def test_a_partial_batch_at_the_end_is_left_out() -> None:
    whole = rb.batch(0, RECORDS) + rb.batch(3, RECORDS)
    assert [b.base_offset for b in decode_batches(whole)] == [0, 3]
    assert [b.base_offset for b in decode_batches(whole[:-5])] == [0]


@pytest.mark.parametrize(("data", "match"), [
    (rb.batch(0, RECORDS, magic=1), "magic 1"),
    (rb.batch(0, RECORDS, codec=5), "unknown codec 5"),
    (rb.batch(0, RECORDS, codec=1, compress=lambda d: b"not gzip"), "gzip data is corrupt"),
    (rb.batch(0, [rb.zigzag(4) + b"\x00\x00\x00\x01\x01\x00"]), "does not match its fields"),
    (rb.batch(0, [RECORDS[0] + b"\x00"]), "1 bytes after its 1 records"),
    (rb.batch(0, [rb.zigzag(40) + b"\x00\x00\x00" + rb.zigzag(500)]), "runs past"),
])
def test_malformed_batches_are_decode_errors(data: bytes, match: str) -> None:
    with pytest.raises(ProtocolDecodeError, match=match):
        decode_batches(data)


def test_control_and_transactional_flags_are_reported() -> None:
    (batch,) = decode_batches(rb.batch(0, RECORDS[:1], attributes=0x30))
    assert batch.control and batch.transactional


def _columns_of(*bodies: _Body, by_columns: bool) -> Columns:
    cols = Columns()
    if by_columns:
        assert _parse_columns(bodies, cols)
    else:
        for b in bodies:
            _parse(b.data, b.records, b.base_offset, b.base_ts, log_append_ts=b.log_append_ts,
                   cols=cols)
    return cols


def _random_records(rng: random.Random) -> list[bytes]:
    sizes = [None, 0, 1, 6, 63, 64, 200, 8_200, 20_000]
    return [rb.record(i * rng.choice((1, 2)),
                      rng.choice((0, 5, -3, 70, -9_000, 2**40, -2**55)),
                      None if (n := rng.choice(sizes)) is None else rng.randbytes(n),
                      None if (m := rng.choice(sizes)) is None else rng.randbytes(m))
            for i in range(rng.randint(0, 60))]


@pytest.mark.parametrize("seed", range(6))
def test_batches_without_headers_are_read_by_columns_as_the_loop_reads_them(seed: int) -> None:
    """The numpy path (``_parse_columns``, a fetch's batches at once) against the record loop
    (``_parse``) on records of every field width: null, empty and long keys and values
    (lengths of 1-3 varint bytes, so records whose own length takes 1-3 bytes), timestamp
    deltas of up to 9 varint bytes, negative ones too; a batch of LogAppendTime among them."""
    rng = random.Random(seed)
    recs = [_random_records(rng) for _ in range(4)]
    bodies = [_Body(b"".join(r), len(r), 500 + 1000 * i, 10_000 * i, 77 if i == 2 else None)
              for i, r in enumerate(recs)]
    fast = _columns_of(*bodies, by_columns=True)
    assert fast == _columns_of(*bodies, by_columns=False)
    assert fast == _columns_of(*[b._replace(data=bytes(b.data)) for b in bodies],
                               by_columns=False)
    data = b"".join(rb.batch(500 + 1000 * i, r, base_ts=10_000 * i,
                             attributes=0x08 if i == 2 else 0, max_ts=77)
                    for i, r in enumerate(recs))
    batches = decode_batches(data)
    assert [len(b.records) for b in batches] == [len(r) for r in recs]
    assert [r for b in batches for r in b.records] == \
        list(RecordBatch(0, 0, 0, "none", False, False, False, 0, fast, 0, len(fast)).records)


def test_batches_with_a_header_or_a_bad_length_are_left_to_the_loop() -> None:
    plain = [rb.record(0, 0, b"k", b"v"), rb.record(1, 0, None, b"w")]
    with_header = [*plain, rb.record(2, 0, b"k", b"v", (("h", b"x"),))]
    for data, count in ((b"".join(with_header), 3), (b"".join(plain) + b"\x00", 2),
                        (b"".join(plain)[:-1], 2), (b"".join(plain), 3)):
        cols = Columns()
        good = _Body(b"".join(plain), 2, 0, 0, None)
        assert not _parse_columns([good, _Body(data, count, 0, 0, None)], cols)
        assert cols == Columns()  # untouched
    (first, second) = decode_batches(rb.batch(0, plain) + rb.batch(2, with_header))
    assert [r.headers for r in (*first.records, *second.records)] == \
        [(), (), (), (), (("h", b"x"),)]
    assert [(b.start, b.stop) for b in (first, second)] == [(0, 2), (2, 5)]


def _good() -> bytes:
    return rb.batch(10, [rb.record(0, 0, b"k", b"v"), rb.record(1, 0, b"k2", b"v2")])


def test_a_negative_record_count_is_a_decode_error() -> None:
    """Review of the columnar decoder: a count below 0 shifted every later batch's rows."""
    data = bytearray(rb.batch(0, []))
    struct.pack_into(">i", data, 57, -1)  # recordCount, the batch header's last field
    with pytest.raises(ProtocolDecodeError, match="a record count of -1"):
        decode_batches(bytes(data) + _good(), check_crc=False)


def test_a_varint_past_64_bits_is_a_decode_error_not_a_wrapped_value() -> None:
    overlong = bytes([0x86, *[0x80] * 8, 0x02])  # zigzag 3 + 2**64: numpy would wrap it to 3
    body = b"\x00" + rb.zigzag(0) + rb.zigzag(0) + overlong + b"abc" + rb.zigzag(1) + b"v\x00"
    with pytest.raises(ProtocolDecodeError):
        decode_batches(rb.batch(0, [rb.zigzag(len(body)) + body]) + _good())


def test_a_timestamp_past_64_bits_is_a_decode_error_not_a_wrapped_value() -> None:
    data = rb.batch(0, [rb.record(0, 2**62, b"k", b"v")], base_ts=2**62)
    with pytest.raises(ProtocolDecodeError, match="malformed record"):
        decode_batches(data + _good())
