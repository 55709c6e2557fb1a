"""Replaying ``offsets`` journal slots (no broker): the rows rebuilt from what Kafka returns
equal the first attempt's (checksum), each partition is read once for all slots of a task,
and records gone or changed fail the task or, with ``failOnDataLoss=false``, are skipped and
counted. The same path against a real broker: tests/integration/test_journal_replay.py."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pytest

from pyspark_kafka_share._kafka.arrow import messages_to_batch
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.replay import PartitionRead
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share.errors import DataLossError
from pyspark_kafka_share.source.journal import replay as replay_module
from pyspark_kafka_share.source.journal.journal import Journal
from pyspark_kafka_share.source.journal.replay import ReplaySettings, SlotReader, describe_offsets
from pyspark_kafka_share.source.journal.slots import (
    EndMarker,
    OffsetSlot,
    offsets_slot,
    read_slot,
    runs_of,
)

from .fakes import Msg

ReadOffsets = Callable[..., dict[TopicPartition, PartitionRead]]


def fake_kafka(*, low: int = 0, high: int = 10**9, gone: frozenset[int] = frozenset(),
               value: bytes = b"v", calls: list[dict[TopicPartition, list[int]]] | None = None) \
        -> ReadOffsets:
    """A stand-in for ``_kafka.replay.read_offsets``: a log holding ``Msg(offset, value=...)``
    at every offset in ``[low, high)`` but ``gone``; ``calls`` records what each call asked."""

    def read(settings: ClientSettings, wanted: Mapping[TopicPartition, npt.NDArray[np.int64]],
             *, isolation_level: str, stall_s: float | None = None) \
            -> dict[TopicPartition, PartitionRead]:
        if calls is not None:
            calls.append({tp: o.tolist() for tp, o in wanted.items()})
        out = {}
        for tp, offs in wanted.items():
            there = [o for o in offs.tolist() if low <= o < high and o not in gone]
            out[tp] = PartitionRead(
                records={o: Msg(o, value=value, topic=tp.topic, partition=tp.partition)
                         for o in there},
                missing=np.setdiff1d(offs, np.asarray(there, np.int64)), low=low, high=high)
        return out

    return read


def _batch(offsets: list[int], dc: int = 1, partition: int = 0) -> pa.RecordBatch:
    return messages_to_batch([Msg(o, dc, partition=partition) for o in offsets], False)


def _reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read: ReadOffsets, *,
            fail: bool = True) -> tuple[SlotReader, Counter[str]]:
    monkeypatch.setattr(replay_module, "read_offsets", read)
    log = Journal(str(tmp_path / "j"), fsync=False).part_log(3, 0)
    log.open()
    log.append(_batch([0, 1, 2]), attempt=1)
    log.append(pa.concat_batches([_batch([5], dc=2), _batch([3], partition=1)]), attempt=2)
    stats: Counter[str] = Counter()
    settings = ReplaySettings(ClientSettings("unused:9092", "g"), fail_on_data_loss=fail)
    return SlotReader(log, settings, stats), stats


def test_an_offsets_slot_holds_runs_in_row_order_and_under_a_byte_per_record() -> None:
    batch = messages_to_batch([Msg(o) for o in range(2000)] + [Msg(7, 2, partition=1)], False)
    held = read_slot(offsets_slot(batch, 4))
    assert isinstance(held, OffsetSlot) and held.rows == 2001
    assert held.runs.to_pylist() == [
        {"topic": "in", "partition": 0, "offset": 0, "count": 2000, "deliveryCount": 1},
        {"topic": "in", "partition": 1, "offset": 7, "count": 1, "deliveryCount": 2}]
    assert runs_of(batch).num_rows == 2


def test_a_replay_yields_the_first_attempts_rows_and_reads_each_partition_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[TopicPartition, list[int]]] = []
    reader, stats = _reader(tmp_path, monkeypatch, fake_kafka(calls=calls))
    tables = dict(reader.read([0, 1]))
    assert tables[0].to_pylist() == _batch([0, 1, 2]).to_pylist()
    assert tables[1].to_pylist() == pa.concat_batches(
        [_batch([5], dc=2), _batch([3], partition=1)]).to_pylist(), \
        "row order and delivery counts as polled"
    assert calls == [{TopicPartition("in", 0): [0, 1, 2, 5], TopicPartition("in", 1): [3]}], \
        "one read for both slots, each partition once"
    assert (stats["slots_replayed"], stats["records_replayed"], stats["records_lost"]) == (2, 5, 0)


def test_records_gone_from_kafka_fail_the_task_naming_batch_partition_offsets_cause_and_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader, _ = _reader(tmp_path, monkeypatch, fake_kafka(low=2))
    with pytest.raises(DataLossError) as info:
        dict(reader.read([0, 1]))
    text = str(info.value)
    assert "batch 3, input partition 0, journal slot 0" in text
    assert "in:0 offsets 0-1" in text and "below the log start offset 2" in text
    assert "retention or deleteRecords" in text
    assert "journalContent=records" in text and "failOnDataLoss=false" in text


def test_without_fail_on_data_loss_lost_records_are_skipped_counted_and_logged_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    reader, stats = _reader(tmp_path, monkeypatch, fake_kafka(gone=frozenset({1, 5})),
                            fail=False)
    with caplog.at_level(logging.WARNING):
        tables = dict(reader.read([0, 1]))
        dict(reader.read([0]))
    assert tables[0].column("offset").to_pylist() == [0, 2]
    assert tables[1].column("offset").to_pylist() == [3]
    assert stats["records_lost"] == 3
    warnings = [r for r in caplog.records if "failOnDataLoss=false" in r.getMessage()]
    assert len(warnings) == 1, "logged once per batch"
    assert "skipped inside the log" in warnings[0].getMessage()
    reader.write_losses(attempt=9)
    log = reader.log
    log.end(lambda s: EndMarker(attempt=1, data_slots=2, records=5))
    ends = Journal(str(tmp_path / "j")).batch_ends(3)  # the journal _reader's log is in
    assert ends[0].stats["records_lost"] == 3, "counted in the batch's progress metrics"


def test_a_record_changed_at_its_offset_is_a_checksum_mismatch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic deleted and re-created holds other records at the same offsets."""
    reader, _ = _reader(tmp_path, monkeypatch, fake_kafka(value=b"other"))
    with pytest.raises(DataLossError, match="checksum mismatch") as info:
        dict(reader.read([0]))
    assert "in:0 offsets 0-2" in str(info.value) and "re-created" in str(info.value)
    reader, stats = _reader(tmp_path / "b", monkeypatch, fake_kafka(value=b"other"), fail=False)
    assert dict(reader.read([0]))[0].num_rows == 0
    assert stats["records_lost"] == 3


def test_records_slots_need_no_kafka(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_kafka(*args: Any, **kwargs: Any) -> dict[TopicPartition, PartitionRead]:
        raise AssertionError("a records slot was read from Kafka")

    monkeypatch.setattr(replay_module, "read_offsets", no_kafka)
    log = Journal(str(tmp_path / "j"), fsync=False, content="records").part_log(1, 0)
    log.open()
    log.append(_batch([4, 5]), attempt=1)
    reader = SlotReader(log, ReplaySettings(ClientSettings("unused:9092", "g")), Counter())
    assert dict(reader.read([0]))[0].to_pylist() == _batch([4, 5]).to_pylist()


def test_offsets_are_described_as_ranges() -> None:
    offs = np.asarray([1, 2, 3, 7, 9, 10], np.int64)
    assert describe_offsets(offs) == "1-3, 7, 9-10"
    assert describe_offsets(offs, limit=1) == "1-3 (+2 more ranges)"


def test_a_long_replay_reads_kafka_in_chunks_of_slots(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task's replay holds at most about REPLAY_CHUNK_ROWS records: slots are read back in
    chunks, each partition's range once per chunk."""
    calls: list[dict[TopicPartition, list[int]]] = []
    reader, _ = _reader(tmp_path, monkeypatch, fake_kafka(calls=calls))
    monkeypatch.setattr(replay_module, "REPLAY_CHUNK_ROWS", 3)
    assert [slot for slot, _ in reader.read([0, 1])] == [0, 1]
    assert calls == [{TopicPartition("in", 0): [0, 1, 2]},
                     {TopicPartition("in", 0): [5], TopicPartition("in", 1): [3]}]
