"""The journal's slot protocol on a real local filesystem (no broker, no Spark)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_kafka_share._kafka.arrow import arrow_schema
from pyspark_kafka_share.errors import JournalClosed
from pyspark_kafka_share.source.journal.journal import EndMarker, Journal, ScanResult


def _batch(topic: str, offsets: list[int]) -> pa.RecordBatch:
    n = len(offsets)
    cols = {"key": [None] * n, "value": [b"v"] * n, "topic": [topic] * n,
            "partition": [0] * n, "offset": offsets, "timestamp": [None] * n,
            "timestampType": [0] * n, "deliveryCount": [1] * n}
    return pa.RecordBatch.from_pydict(cols, schema=arrow_schema(False))


def _end(attempt: int, acked: tuple[int, ...] = ()) -> object:
    return lambda s: EndMarker(attempt=attempt, data_slots=len(s.data_slots), records=0,
                               acked_slots=acked)


def _offsets(journal: Journal, scan: ScanResult, seq: int = 1) -> list[int]:
    return [o for b in journal.part_log(seq, 0).read(scan) for o in b.column("offset").to_pylist()]


def test_slots_are_exclusive_and_nothing_follows_end(tmp_path: Path) -> None:
    j = Journal(str(tmp_path))
    a, b = j.part_log(1, 0), j.part_log(1, 0)
    a.open()
    b.open()
    assert a.append(_batch("t", [0, 1]), attempt=1) == 0
    assert b.append(_batch("t", [2]), attempt=2) == 1  # b found slot 0 taken, took slot 1
    final = a.end(_end(1))
    assert final.data_slots == [0, 1] and final.end is not None and final.end.attempt == 1
    with pytest.raises(JournalClosed):
        b.append(_batch("t", [3]), attempt=2)
    assert b.end(_end(2)).end == final.end, "the first END stands"
    assert _offsets(j, final) == [0, 1, 2]
    assert a.writer(0) == 1 and a.writer(1) == 2
    assert j.part_log(1, 0).read(final).__next__().schema == arrow_schema(False), \
        "slot metadata must not leak into the schema Spark checks"


def test_concurrent_creators_exactly_one_wins_each_slot(tmp_path: Path) -> None:
    j = Journal(str(tmp_path), fsync=False)
    j.part_log(1, 0).open()
    won: list[int] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        log = j.part_log(1, 0)
        for k in range(20):
            slot = log.append(_batch("t", [i * 100 + k]), attempt=i)
            with lock:
                won.append(slot)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == list(range(80)), "a slot was won twice or skipped"
    scan = j.part_log(1, 0).scan()
    assert sorted(_offsets(j, scan)) == sorted(i * 100 + k for i in range(4) for k in range(20))


def test_dedup_finds_published_keys_before_and_after_commit(tmp_path: Path) -> None:
    j = Journal(str(tmp_path))
    log = j.part_log(1, 0)
    log.open()
    log.append(_batch("t", [5, 6]), attempt=1)  # published, acknowledgement not confirmed
    log.append(_batch("t", [7]), attempt=1)      # confirmed
    log.end(_end(1, acked=(1,)))
    probe = {("t", 0, 5), ("t", 0, 7), ("t", 0, 99)}
    assert j.find_journaled(probe) == {("t", 0, 5), ("t", 0, 7)}
    j.commit(1, dedup_retention_ms=3_600_000)
    assert not (tmp_path / "batches" / "000000000001").exists()
    assert j.find_journaled(probe) == {("t", 0, 5)}, "unconfirmed keys must outlive the batch"
    assert j.committed_seq() == 1


def test_late_attempt_of_a_committed_batch_cannot_publish(tmp_path: Path) -> None:
    j = Journal(str(tmp_path))
    late = j.part_log(1, 0)
    late.open()  # opened while batch 1 was running
    done = j.part_log(1, 0)
    done.append(_batch("t", [0]), attempt=1)
    done.end(_end(1))
    j.commit(1, dedup_retention_ms=0)
    with pytest.raises(JournalClosed):
        late.append(_batch("t", [1]), attempt=2)  # the directory was renamed away
    with pytest.raises(JournalClosed):
        j.part_log(1, 0).open()  # a new attempt sees the fence
    assert not any(p.name.isdigit() for p in (tmp_path / "batches").glob("*/*/*"))


def test_object_store_journal_is_refused() -> None:
    from pyspark_kafka_share.errors import OptionError
    from pyspark_kafka_share.source.journal.journal import check_journal_uri

    for uri in ("s3://b/p", "gs://b/p", "abfs://c@a/p"):
        with pytest.raises(OptionError, match="journalPath"):
            check_journal_uri(uri)
    for uri in ("/tmp/j", "file:///tmp/j", "hdfs://nn/j"):
        check_journal_uri(uri)


def test_a_retried_create_reported_as_existing_is_recognised_as_ours(tmp_path: Path) -> None:
    j = Journal(str(tmp_path))
    log = j.part_log(1, 0)
    log.open()
    real = j.store.create_exclusive

    def retried(path: str, data: bytes, fsync: bool) -> bool:
        real(path, data, fsync)  # the first try succeeded, the client's retry saw EEXIST
        return False

    j.store.create_exclusive = retried  # type: ignore[method-assign]
    assert log.append(_batch("t", [0]), attempt=7) == 0
    j.store.create_exclusive = real  # type: ignore[method-assign]
    assert j.part_log(1, 0).scan().data_slots == [0], "the batch was written twice"


def test_in_use_tells_a_fresh_journal_from_a_used_one(tmp_path: Path) -> None:
    j = Journal(str(tmp_path))
    assert j.in_use() is None
    j.part_log(3, 0).open()
    assert j.in_use() is None, "an uncommitted first batch is replayed on restart, not refused"
    j.commit(3, dedup_retention_ms=0)
    assert "committed batch 3" in (j.in_use() or "")


def test_dedup_entries_go_once_the_share_partition_start_offset_passes_them(
    tmp_path: Path,
) -> None:
    j = Journal(str(tmp_path))
    log = j.part_log(1, 0)
    log.open()
    log.append(_batch("t", [5, 6]), attempt=1)  # acknowledgement never confirmed
    log.end(_end(1))
    old_enough_to_expire = 1  # ms: by time alone the entry would go at once
    j.commit(1, old_enough_to_expire, start_offsets={"t:0": 6})
    assert j.find_journaled({("t", 0, 5), ("t", 0, 6)}) == {("t", 0, 5), ("t", 0, 6)}, \
        "offset 6 is at the start offset: it may still be redelivered"
    j.prune_dedup({"t:0": 7}, old_enough_to_expire)
    assert j.find_journaled({("t", 0, 5), ("t", 0, 6)}) == set()


def test_without_start_offsets_dedup_entries_expire_by_time(tmp_path: Path) -> None:
    j = Journal(str(tmp_path))
    log = j.part_log(1, 0)
    log.open()
    log.append(_batch("t", [5]), attempt=1)
    log.end(_end(1))
    j.commit(1, dedup_retention_ms=3_600_000, start_offsets=None)
    assert j.find_journaled({("t", 0, 5)}) == {("t", 0, 5)}
    time.sleep(0.01)
    j.prune_dedup(None, retention_ms=1)
    assert j.find_journaled({("t", 0, 5)}) == set()


@pytest.mark.parametrize("fsync", [True, False])
def test_fsync_is_done_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       fsync: bool) -> None:
    import os

    calls: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd))[1])
    log = Journal(str(tmp_path), fsync=fsync).part_log(1, 0)
    log.open()
    log.append(_batch("t", [0]), attempt=1)
    log.end(_end(1))
    assert bool(calls) is fsync
