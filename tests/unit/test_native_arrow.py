"""A fetch decoded straight into the source's Arrow schema (``_kafka/native/columns.py``)
gives the rows the per-record path gives (the native consumer's ``ShareRecord``s read as
messages by ``messages_to_batch``), holds the same offsets, and acknowledges the same GAPs;
and an ``ArrowPoll`` is acknowledged by offset. Batches built byte by byte
(tests/unit/test_native_records.py); real producers' batches and the source end to end are
in tests/integration (test_native_consumer.py, test_source.py)."""

from __future__ import annotations

import time
from collections import Counter

import pyarrow as pa
import pytest

from pyspark_kafka_share._kafka.arrow import ColumnarPoll, join_polls, messages_to_batch
from pyspark_kafka_share._kafka.native.adapter import ArrowPoll, NativeMessage, NativeSession
from pyspark_kafka_share._kafka.native.columns import acquired_batch
from pyspark_kafka_share._kafka.native.consumer import NativeConsumerConfig, NativeShareConsumer
from pyspark_kafka_share._kafka.native.session import Held
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.protocol.consume import AcquiredRange, SharePartitionAnswer
from pyspark_kafka_share.harness.record_batches import batch as _batch
from pyspark_kafka_share.harness.record_batches import record as _record
from pyspark_kafka_share.source.holding import has_repeats, poll_keys
from pyspark_kafka_share.source.journal.slots import rows_checksum
from tests.unit.test_native_records import CODECS

TID, TOPIC = "topic-id-1", "in"


def _fetch() -> bytes:
    """Offsets 10-13 (headers, a null key, a null value, a negative timestamp delta), a
    control batch at 14, a log-append-time batch at 15-16, and 18-19 (17 compacted away)."""
    first = [_record(0, 0, b"k", b"v0", (("h", b"x"), ("n", None))), _record(1, 5, None, b"v1"),
             _record(2, -3, b"k2", None), _record(3, 1, b"", b"")]
    control = [_record(0, 0, b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00")]
    later = [_record(1, 2, b"k18", b"v18"), _record(2, 4, b"k19", b"v19")]
    return (_batch(10, first) + _batch(14, control, attributes=0x20)
            + _batch(15, [_record(0, 0, None, b"a"), _record(1, 0, None, b"b")],
                     attributes=0x08, max_ts=77_000)
            + _batch(17, later, base_ts=5_000))


def _per_record(data: bytes, acquired: tuple[AcquiredRange, ...],
                include_headers: bool) -> tuple[pa.RecordBatch, Held]:
    """The per-record path: the consumer's own ``_acquired``, then ``messages_to_batch``."""
    consumer = NativeShareConsumer.__new__(NativeShareConsumer)
    consumer.config = NativeConsumerConfig("unused:9092", "g")
    consumer._held, consumer._names, consumer.batch_codecs = Held(), {TID: TOPIC}, Counter()
    part = SharePartitionAnswer(TID, 3, 0, None, 0, None, -1, -1, data, acquired)
    records = consumer._acquired(part, time.monotonic() + 30)
    return messages_to_batch([NativeMessage(r) for r in records], include_headers), \
        consumer._held


@pytest.mark.parametrize("include_headers", [False, True])
@pytest.mark.parametrize("acquired", [
    (AcquiredRange(10, 19, 1),),
    (AcquiredRange(11, 12, 2), AcquiredRange(15, 15, 1), AcquiredRange(19, 19, 5)),
])
def test_the_arrow_path_gives_the_per_record_paths_rows_holds_and_gaps(
        include_headers: bool, acquired: tuple[AcquiredRange, ...]) -> None:
    data = _fetch()
    expected, expected_held = _per_record(data, acquired, include_headers)
    held, codecs = Held(), Counter[str]()
    got = acquired_batch(data, acquired, TOPIC, (TID, 3), held, check_crc=True,
                         include_headers=include_headers, codecs=codecs)
    assert got.schema == expected.schema
    assert got.to_pylist() == expected.to_pylist()
    assert rows_checksum(got) == rows_checksum(expected), \
        "the same Arrow buffers: an offsets slot's replay (messages_to_batch) must match"
    assert got.num_rows == expected.num_rows > 0
    assert {tp: set(recs) for tp, recs in held.records.items()} == \
        {tp: set(recs) for tp, recs in expected_held.records.items()}
    assert held.pending == expected_held.pending, "control record 14 and compacted 17: GAP"
    assert codecs == Counter({"none": 4})


@pytest.mark.parametrize("name", sorted(CODECS))
def test_every_codec_reaches_arrow_the_same(name: str) -> None:
    codec, compress = CODECS[name]
    records = [_record(i, i, b"k%d" % i, b"v%d" % i) for i in range(50)]
    plain = acquired_batch(_batch(0, records), (AcquiredRange(0, 49, 1),), TOPIC, (TID, 0),
                           Held(), check_crc=True, include_headers=False, codecs=Counter())
    packed = acquired_batch(_batch(0, records, codec=codec, compress=compress),
                            (AcquiredRange(0, 49, 1),), TOPIC, (TID, 0), Held(),
                            check_crc=True, include_headers=False, codecs=Counter())
    assert packed.equals(plain) and plain.num_rows == 50


def test_part_of_a_batch_acquired_has_the_per_record_paths_buffers() -> None:
    """record_limit acquires part of a producer batch: the rows picked (no null among them)
    must have the buffers messages_to_batch gives, or an offsets slot fails its replay."""
    data = _batch(0, [_record(i, i, b"k%d" % i, b"v%d" % i) for i in range(40)])
    acquired = (AcquiredRange(0, 23, 1),)
    expected, _ = _per_record(data, acquired, False)
    got = acquired_batch(data, acquired, TOPIC, (TID, 3), Held(), check_crc=True,
                         include_headers=False, codecs=Counter())
    assert got.num_rows == 24 and rows_checksum(got) == rows_checksum(expected)


class _Acks:
    """Records what an ``ArrowPoll``'s settlement asks of the consumer."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, list[int], str]] = []

    def acknowledge_offsets(self, topic: str, partition: int, offsets: list[int],
                            kind: str) -> None:
        self.calls.append((topic, partition, offsets, kind))

    def acknowledge(self, record: object, kind: str) -> None:
        raise AssertionError("an ArrowPoll is acknowledged by offset, not record by record")

    def commit_sync(self) -> dict[tuple[str, int], int]:
        return {(TOPIC, 3): 0, (TOPIC, 4): 0}


def test_an_arrow_poll_is_settled_by_offset_and_read_as_messages_on_demand() -> None:
    data = _fetch()
    parts = [acquired_batch(data, (AcquiredRange(10, 13, 1),), TOPIC, (TID, p), Held(),
                            check_crc=True, include_headers=True, codecs=Counter())
             for p in (3, 4)]
    polled = ArrowPoll([parts[0], parts[1].set_column(
        3, "partition", pa.array([4] * 4, pa.int32()))], True, started=5.0)
    assert isinstance(polled, ColumnarPoll) and len(polled) == 8
    assert messages_to_batch(polled, True) is polled.arrow_batch
    assert dict(polled.offsets_by_partition()).keys() == \
        {TopicPartition(TOPIC, 3), TopicPartition(TOPIC, 4)}
    acks = _Acks()
    session = NativeSession(acks)  # type: ignore[arg-type]
    settled = session.settle(accept=polled)
    assert settled.ok and settled.confirmed == {TopicPartition(TOPIC, 3),
                                                TopicPartition(TOPIC, 4)}
    assert sorted(acks.calls) == [(TOPIC, 3, [10, 11, 12, 13], "ACCEPT"),
                                  (TOPIC, 4, [10, 11, 12, 13], "ACCEPT")]
    first = polled[0]  # the rare paths read it record by record
    assert (first.topic(), first.partition(), first.offset(), first.key(), first.value(),
            first.headers(), first.timestamp(), first.delivery_count()) == \
        (TOPIC, 3, 10, b"k", b"v0", [("h", b"x"), ("n", None)], (1, 1_000), 1)
    assert polled[2].value() is None and polled[1].headers() is None
    assert messages_to_batch(polled[:8], True).to_pylist() == polled.arrow_batch.to_pylist()


def test_polls_held_as_one_are_settled_by_offset_and_keep_the_replays_checksum() -> None:
    """A journal slot of several fetches: the polls joined keep their rows in order, with the
    buffers messages_to_batch gives the same records (an offsets slot's replay checks them),
    each record's own lock start, and are acknowledged by offset."""
    data = _fetch()
    polls = [ArrowPoll([acquired_batch(data, (rng,), TOPIC, (TID, 3), Held(), check_crc=True,
                                       include_headers=True, codecs=Counter())], True,
                       started=float(i))
             for i, rng in enumerate((AcquiredRange(10, 13, 1), AcquiredRange(15, 19, 2)))]
    joined = join_polls(polls)
    assert isinstance(joined, ColumnarPoll) and len(joined) == 8
    assert [m.offset() for m in joined] == [10, 11, 12, 13, 15, 16, 18, 19]
    assert [m.record.deadline for m in joined] == [0.0] * 4 + [1.0] * 4
    assert rows_checksum(messages_to_batch(joined, True)) == \
        rows_checksum(messages_to_batch(list(joined), True))
    assert list(joined.offsets_by_partition()[TopicPartition(TOPIC, 3)]) == \
        [10, 11, 12, 13, 15, 16, 18, 19]
    acks = _Acks()
    assert NativeSession(acks).settle(accept=joined).ok  # type: ignore[arg-type]
    assert acks.calls == [(TOPIC, 3, [10, 11, 12, 13, 15, 16, 18, 19], "ACCEPT")]
    assert not has_repeats(joined)
    again = join_polls([*polls, polls[0]])  # 10-13 released and acquired again while held
    assert has_repeats(again) and poll_keys(again) == poll_keys(joined)
    acks = _Acks()
    assert NativeSession(acks).settle(release=again).ok  # type: ignore[arg-type]
    assert acks.calls == [(TOPIC, 3, [10, 11, 12, 13, 15, 16, 18, 19], "RELEASE")], \
        "a repeated offset is acknowledged once"
