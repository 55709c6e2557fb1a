"""The journal's slot protocol (no broker, no Spark) and the checks of ``journalPath`` at
``load()``.

Tests taking the ``journal`` fixture run once per store and content of the data slots
(``offsets``, ``records``): a real local filesystem and ``s3://`` on a local S3 server (moto,
:class:`LocalS3`, shared with the integration tier); the rest run on the local filesystem. They
inspect the journal through the package's :class:`Journal`.
"""

from __future__ import annotations

import errno
import os
import pickle
import random
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from pyspark_kafka_share._kafka.arrow import arrow_schema
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share.errors import JournalClosed, JournalError, OptionError
from pyspark_kafka_share.source.journal import journal as journal_module
from pyspark_kafka_share.source.journal import probe, slots, stores
from pyspark_kafka_share.source.journal.journal import Journal, ScanResult
from pyspark_kafka_share.source.journal.keys import SlotKeys, unique_offsets
from pyspark_kafka_share.source.journal.location import JournalLocation
from pyspark_kafka_share.source.journal.stores.local import LocalStore
from pyspark_kafka_share.source.options import parse_options
from tests.fixtures.journal import JournalAt, end_marker, record_batch, records_at
from tests.helpers import read_only_dir


def _offsets(journal: Journal, scan: ScanResult, seq: int = 1) -> list[int]:
    log = journal.part_log(seq, 0)
    return [o for slot in scan.data_slots
            for o in log.identities(slot).column("offset").to_pylist()]


def test_slots_are_exclusive_and_nothing_follows_end(journal: JournalAt) -> None:
    j = journal.open()
    a, b = j.part_log(1, 0), j.part_log(1, 0)
    a.open()
    b.open()
    assert a.append(record_batch("t", [0, 1]), attempt=1) == 0
    assert b.append(record_batch("t", [2]), attempt=2) == 1  # b found slot 0 taken, took slot 1
    final = a.end(end_marker(1))
    assert final.data_slots == [0, 1] and final.end is not None and final.end.attempt == 1
    with pytest.raises(JournalClosed):
        b.append(record_batch("t", [3]), attempt=2)
    assert b.end(end_marker(2)).end == final.end, "the first END stands"
    assert _offsets(j, final) == [0, 1, 2]
    assert a.writer(0) == 1 and a.writer(1) == 2
    held = j.part_log(1, 0).slot(0)
    if journal.content == "records":
        assert isinstance(held, pa.Table) and held.schema == arrow_schema(False), \
            "slot metadata must not leak into the schema Spark checks"
    else:
        assert isinstance(held, slots.OffsetSlot) and held.rows == 2


def test_concurrent_creators_exactly_one_wins_each_slot(journal: JournalAt) -> None:
    j = journal.open(fsync=False)
    j.part_log(1, 0).open()
    won: list[int] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        log = j.part_log(1, 0)
        for k in range(20):
            slot = log.append(record_batch("t", [i * 100 + k]), attempt=i)
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


def test_dedup_finds_published_keys_before_and_after_commit_and_one_query_owns_it(
    journal: JournalAt,
) -> None:
    j = journal.open()
    assert j.in_use() is None
    j.claim("query-a")
    j.claim("query-a")
    journal_module._CLAIMED.pop(j.uri, None)  # as another process would see it
    with pytest.raises(JournalError, match="belongs to streaming query query-a"):
        journal.open().claim("query-b")
    log = j.part_log(1, 0)
    log.open()
    log.append(record_batch("t", [5, 6]), attempt=1)  # published, acknowledgement not confirmed
    log.append(record_batch("t", [7]), attempt=1)      # confirmed
    log.end(end_marker(1, acked=(1,)))
    probe = {("t", 0, 5), ("t", 0, 7), ("t", 0, 99)}
    assert j.find_journaled(probe) == {("t", 0, 5), ("t", 0, 7)}
    j.commit(1, dedup_retention_ms=3_600_000)
    assert j.batches() == []
    assert j.store.listdir(j._p("batches")) == [], "the committed batch was not deleted"
    assert j.find_journaled(probe) == {("t", 0, 5)}, "unconfirmed keys must outlive the batch"
    assert j.committed_seq() == 1
    assert "committed batch 1" in (j.in_use() or "")
    j.prune_dedup({TopicPartition("t", 0): 7}, 1)
    assert j.find_journaled(probe) == set()


def test_the_index_lookup_finds_exactly_what_the_slots_hold(tmp_path: Path) -> None:
    """Random slots over several topic-partitions, some of several partitions: every lookup
    (through the index's names and the overlapping slots only) finds exactly the published
    keys among the probe's."""
    rng = random.Random(7)
    j = Journal(str(tmp_path / "j"), fsync=False)
    j.part_log(1, 0).open()

    def some(n: int) -> set[tuple[str, int, int]]:
        return {(rng.choice("ab"), rng.randrange(3), rng.randrange(5_000)) for _ in range(n)}

    union = set[tuple[str, int, int]]()
    for n in range(120):
        keys = some(rng.randrange(1, 60))
        log = j.part_log(1, n % 4)
        log.open()
        log.append(records_at(sorted(keys)), attempt=1)
        union |= keys
        probe = some(100) | set(rng.sample(sorted(union), 5))
        assert j.find_journaled(probe) == probe & union
        assert Journal(str(tmp_path / "j")).find_journaled(probe) == probe & union, \
            "another process (no cached keys) must find the same"


def test_slot_keys_of_a_table_are_those_of_its_rows() -> None:
    rows = [("a", 0, 5), ("b", 1, 5), ("a", 0, 2), ("a", 1, 9)]
    table = pa.table({"topic": [r[0] for r in rows], "partition": [r[1] for r in rows],
                      "offset": [r[2] for r in rows]})
    assert sorted(SlotKeys.of_table(table).keys()) == sorted(rows)
    assert sorted(SlotKeys.of_table(table.slice(0, 1)).keys()) == [("a", 0, 5)]
    assert list(SlotKeys.of_table(table.slice(0, 0)).keys()) == []


def test_slot_keys_of_one_partition_are_sorted_and_unique_in_any_row_order() -> None:
    """One partition, the common case, skips numpy's ``unique`` when the offsets increase
    already; any other order or a repeated offset still gives the sorted, unique keys."""
    for offsets in ([7, 8, 9], [9, 7, 8], [7, 7, 8], [5]):
        table = pa.table({"topic": ["a"] * len(offsets), "partition": [3] * len(offsets),
                          "offset": offsets})
        keys = SlotKeys.of_table(table).by_partition[TopicPartition("a", 3)]
        assert keys.tolist() == sorted(set(offsets)), offsets
        assert keys.tolist() == unique_offsets(np.asarray(offsets)).tolist()


def test_the_local_store_lists_every_file_below_a_directory(tmp_path: Path) -> None:
    """``files_under`` (the duplicate lookup lists the open batches with it on every poll):
    files at any depth, as ``/``-separated relative paths; directories and what a symlink to a
    directory holds are not listed; a missing directory lists nothing."""
    for rel in ("000001/00000/000000", "000001/00000/.tmp-x", "000001/00002/000000",
                "000002/00000/000000", "top"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    (tmp_path / "000003" / "empty").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "000001")
    store = LocalStore()
    assert sorted(store.files_under(str(tmp_path))) == [
        "000001/00000/.tmp-x", "000001/00000/000000", "000001/00002/000000",
        "000002/00000/000000", "top"]
    assert store.files_under(str(tmp_path / "missing")) == []


def test_a_deleted_and_reused_journal_is_not_judged_by_keys_cached_before(
    journal: JournalAt,
) -> None:
    # Every polled record is looked up, and a worker process caches the keys of the slots it
    # read. If the directory is deleted and reused by a new run, a stale entry would claim
    # keys the new slot does not hold: those records would be ACCEPTed and never emitted.
    j = journal.open()
    j.check_marker(j.place_marker())
    log = j.part_log(1, 0)
    log.open()
    log.append(record_batch("t", [5]), attempt=1)
    assert j.find_journaled({("t", 0, 5)}) == {("t", 0, 5)}  # now cached in this process
    j.store.remove_tree(j.root)
    again = journal.open()
    again.check_marker(again.place_marker())  # a new run: the marker every task checks
    # Another process publishes the same slot path with other records (index entry, slot).
    payload = slots.data_slot(record_batch("t", [6]), 2)
    again.index_slot(1, 0, 0, SlotKeys.of({("t", 0, 6)}))
    again.store.makedirs(again.part_log(1, 0).dir)
    assert again.store.create_exclusive(again.part_log(1, 0).slot_path(0), payload, False)
    assert again.find_journaled({("t", 0, 5), ("t", 0, 6)}) == {("t", 0, 6)}, \
        "a record was judged by the keys of a deleted slot"


def test_cached_keys_of_committed_batches_are_dropped(journal: JournalAt) -> None:
    j = journal.open()
    for seq in (1, 2):
        log = j.part_log(seq, 0)
        log.open()
        log.append(record_batch("t", [seq * 10]), attempt=seq)
        log.end(end_marker(seq, acked=(0,)))
    j.find_journaled({("t", 0, 10)})
    cached = [k for k in journal_module._KEY_CACHE if k.startswith(f"{j.uri}\0")]
    assert any("/000000000001/" in k for k in cached)
    j.commit(1, dedup_retention_ms=3_600_000)
    assert j.find_journaled({("t", 0, 10), ("t", 0, 20)}) == {("t", 0, 20)}
    cached = [k for k in journal_module._KEY_CACHE if k.startswith(f"{j.uri}\0")]
    assert not any("/000000000001/" in k for k in cached), "a committed batch stayed cached"
    assert any("/000000000002/" in k for k in cached)


def test_late_attempt_of_a_committed_batch_cannot_publish(tmp_path: Path) -> None:
    j = Journal(str(tmp_path))
    late = j.part_log(1, 0)
    late.open()  # opened while batch 1 was running
    done = j.part_log(1, 0)
    done.append(record_batch("t", [0]), attempt=1)
    done.end(end_marker(1))
    j.commit(1, dedup_retention_ms=0)
    with pytest.raises(JournalClosed):
        late.append(record_batch("t", [1]), attempt=2)  # the directory was renamed away
    with pytest.raises(JournalClosed):
        j.part_log(1, 0).open()  # a new attempt sees the fence
    assert not any(p.name.isdigit() for p in (tmp_path / "batches").glob("*/*/*"))


def test_journal_urls_object_stores_accepted_others_refused() -> None:
    from pyspark_kafka_share.errors import OptionError
    from pyspark_kafka_share.source.journal.probe import check_journal_uri

    for uri in ("/tmp/j", "file:///tmp/j", "hdfs://nn/j", "s3://b/p", "s3a://b/p", "gs://b/p",
                "abfs://c@a.dfs.core.windows.net/p", "abfss://c@a.dfs.core.windows.net/p"):
        check_journal_uri(uri)  # no I/O
    for uri in ("ftp://h/j", "wasbs://c@a/p", "s3:///no-bucket"):
        with pytest.raises(OptionError, match="journalPath"):
            check_journal_uri(uri)


def test_a_journal_path_is_parsed_into_what_its_store_needs() -> None:
    s3 = JournalLocation.parse("S3a://bucket/a/b/")
    assert (s3.kind, s3.scheme, s3.bucket_url, s3.path, s3.store, s3.extra) == \
        ("object", "s3a", "s3a://bucket", "a/b", "S3", "s3")
    azure = JournalLocation.parse("abfss://c@a.dfs.core.windows.net/j")
    assert (azure.bucket_url, azure.path, azure.extra) == \
        ("abfss://c@a.dfs.core.windows.net", "j", "azure")
    assert (JournalLocation.parse("hdfs://nn:8020/x/j").kind,
            JournalLocation.parse("hdfs://nn:8020/x/j").path) == ("hadoop", "/x/j")
    assert JournalLocation.parse("file:///x/j").path == "/x/j"
    relative = JournalLocation.parse("rel/j")
    assert (relative.kind, relative.path) == ("local", "rel/j"), \
        "made absolute where it is opened, not where it is parsed"
    assert pickle.loads(pickle.dumps(s3)) == s3


def test_the_journal_path_is_parsed_once_and_travels_parsed_to_the_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # load() parses journalPath once; the probe, the store factory and the journal a task
    # opens from the (pickled) options all take that value.
    parsed: list[str] = []
    real_parse = JournalLocation.parse

    def parse(uri: str) -> JournalLocation:
        parsed.append(uri)
        return real_parse(uri)

    monkeypatch.setattr(JournalLocation, "parse", staticmethod(parse))
    opened: list[JournalLocation] = []
    real_store_for = stores.store_for

    def store_for(location: JournalLocation, options: Any = (),
                  **kwargs: Any) -> tuple[stores.Store, str]:
        opened.append(location)
        return real_store_for(location, options, **kwargs)

    monkeypatch.setattr(probe, "store_for", store_for)
    monkeypatch.setattr(journal_module, "store_for", store_for)
    path = str(tmp_path / "j")
    opts = parse_options({**_BASE, "journalPath": path})
    assert opts.journal_path == path
    settings = pickle.loads(pickle.dumps(opts)).journal_settings()  # as a task gets them
    assert settings is not None
    journal = Journal.of(settings)
    assert parsed == [path], "journalPath parsed more than once"
    assert opened == [opts.journal_location] * 2, "the probe's store and the journal's"
    assert isinstance(opened[1], JournalLocation) and journal.root == path


@pytest.mark.parametrize(("uri", "extra"), [("s3://b/j", "s3"), ("s3a://b/j", "s3"),
                                            ("gs://b/j", "gcs"), ("abfss://c@a/j", "azure")])
def test_a_missing_extra_is_named_at_load(uri: str, extra: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from pyspark_kafka_share.errors import OptionError
    from pyspark_kafka_share.source.journal.probe import check_journal

    monkeypatch.setitem(sys.modules, "obstore", None)  # import obstore -> ImportError
    with pytest.raises(OptionError, match=rf"pip install 'pyspark-kafka-share\[{extra}\]'"):
        check_journal(JournalLocation.parse(uri), {})


def test_a_retried_create_reported_as_existing_is_recognised_as_ours(
    journal: JournalAt,
) -> None:
    j = journal.open()
    log = j.part_log(1, 0)
    log.open()
    real = j.store.create_exclusive

    def retried(path: str, data: bytes, fsync: bool) -> bool:
        real(path, data, fsync)  # the first try succeeded (its response was lost); the
        return False             # client's retry saw EEXIST (NFS) or 412 (S3)

    j.store.create_exclusive = retried  # type: ignore[method-assign]
    assert log.append(record_batch("t", [0]), attempt=7) == 0
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
    log.append(record_batch("t", [5, 6]), attempt=1)  # acknowledgement never confirmed
    log.end(end_marker(1))
    old_enough_to_expire = 1  # ms: by time alone the entry would go at once
    j.commit(1, old_enough_to_expire, start_offsets={TopicPartition("t", 0): 6})
    assert j.find_journaled({("t", 0, 5), ("t", 0, 6)}) == {("t", 0, 5), ("t", 0, 6)}, \
        "offset 6 is at the start offset: it may still be redelivered"
    j.prune_dedup({TopicPartition("t", 0): 7}, old_enough_to_expire)
    assert j.find_journaled({("t", 0, 5), ("t", 0, 6)}) == set()


def test_without_start_offsets_dedup_entries_expire_by_time(tmp_path: Path) -> None:
    j = Journal(str(tmp_path))
    log = j.part_log(1, 0)
    log.open()
    log.append(record_batch("t", [5]), attempt=1)
    log.end(end_marker(1))
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
    def counted_fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counted_fsync)
    log = Journal(str(tmp_path), fsync=fsync).part_log(1, 0)
    log.open()
    log.append(record_batch("t", [0]), attempt=1)
    log.end(end_marker(1))
    assert bool(calls) is fsync


class _CountingStore:
    """Wraps a store and counts whole and partial reads per path."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.reads: list[str] = []
        self.heads: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def read(self, path: str) -> bytes:
        self.reads.append(path)
        return bytes(self.inner.read(path))

    def read_head(self, path: str, size: int) -> bytes:
        self.heads.append(path)
        return bytes(self.inner.read_head(path, size))


def test_scan_reads_one_listing_and_only_the_last_slot(tmp_path: Path) -> None:
    j = Journal(str(tmp_path), fsync=False)
    log = j.part_log(1, 0)
    log.open()
    for i in range(5):
        log.append(record_batch("t", [i]), attempt=1)
    counting = _CountingStore(j.store)
    j.store = counting  # type: ignore[assignment]
    scan = j.part_log(1, 0).scan()
    assert (scan.data_slots, scan.end, scan.next_slot) == ([0, 1, 2, 3, 4], None, 5)
    assert counting.reads == [] and counting.heads == [log.slot_path(4)]
    log.end(end_marker(1))
    counting.reads.clear()
    counting.heads.clear()
    scan = j.part_log(1, 0).scan()
    assert scan.data_slots == [0, 1, 2, 3, 4] and scan.end is not None and scan.next_slot == 5
    assert counting.heads == [log.slot_path(5)] and counting.reads == [], \
        "only the END marker (the last slot) may be read, in one ranged read"
    counting.heads.clear()
    assert set(j.batch_ends(1)) == {0} and counting.reads == [] and len(counting.heads) == 1


def test_a_create_reported_existing_for_an_absent_slot_is_retried(tmp_path: Path) -> None:
    # S3 answers 409 ConditionalRequestConflict while another conditional write is in flight;
    # object_store reports it as "already exists" though the object may never appear.
    j = Journal(str(tmp_path))
    log = j.part_log(1, 0)
    log.open()
    real = j.store.create_exclusive
    refused: list[str] = []

    def conflicting(path: str, data: bytes, fsync: bool) -> bool:
        if path.startswith(log.dir) and len(refused) < 2:  # the slot, not its index entry
            refused.append(path)
            return False
        return bool(real(path, data, fsync))

    j.store.create_exclusive = conflicting  # type: ignore[method-assign]
    assert log.append(record_batch("t", [0]), attempt=1) == 0, "the slot was skipped, not retried"
    assert refused == [log.slot_path(0)] * 2
    assert log.end(end_marker(1)).data_slots == [0]


def test_commit_writes_no_dedup_keys_for_slots_of_an_already_committed_batch(
    tmp_path: Path,
) -> None:
    # Without rename (object stores), a late attempt can create a slot in a committed batch
    # after its data was deleted, and die before withdrawing it. Those records were never
    # acknowledged: taking them for published ones would drop their redeliveries.
    j = Journal(str(tmp_path))
    log = j.part_log(1, 0)
    log.open()
    log.append(record_batch("t", [0]), attempt=1)
    log.end(end_marker(1, acked=(0,)))
    j.commit(1, dedup_retention_ms=3_600_000)
    orphan_dir = tmp_path / "batches" / "000000000001" / "00000"
    orphan_dir.mkdir(parents=True)
    late = j.part_log(1, 0)
    late._next = 0
    assert late.append(record_batch("t", [7]), attempt=9) == 0  # the late attempt's slot
    j.part_log(2, 0).open()
    j.part_log(2, 0).end(end_marker(1))
    j.commit(2, dedup_retention_ms=3_600_000)
    assert j.find_journaled({("t", 0, 7)}) == set(), "an orphan slot was taken as published"
    assert not (tmp_path / "batches" / "000000000001").exists(), "the orphan was not swept"
    assert j.committed_seq() == 2
    j.commit(1, dedup_retention_ms=3_600_000)
    assert j.committed_seq() == 2, "the fence went backwards"


def test_store_options_never_appear_in_repr_or_errors() -> None:
    from pyspark_kafka_share.errors import OptionError
    from pyspark_kafka_share.source.options import parse_options

    secret = "wJalrXUtnFEMI-K7MDENG-SECRET"
    base = {"kafka.bootstrap.servers": "h:9092", "kafka.group.id": "g", "subscribe": "a"}
    with pytest.raises(OptionError) as info:
        parse_options({**base, "journalPath": "/tmp/j", "journal.aws_secret_access_key": secret})
    assert info.value.option == "journal.aws_secret_access_key"
    assert secret not in str(info.value) and secret not in repr(info.value)
    with pytest.raises(OptionError) as info:
        parse_options({**base, "journalPath": "s3://bucket/j", "journal.aws_no_such": secret})
    assert info.value.option == "journal.aws_no_such" and secret not in str(info.value)
    with pytest.raises(OptionError) as info:  # a value obstore cannot parse is not echoed
        parse_options({**base, "journalPath": "s3://bucket/j",
                       "journal.aws_skip_signature": secret})
    assert secret not in str(info.value)
    from pyspark_kafka_share.source.options import SourceOptions

    opts = SourceOptions("h:9092", "g", ("a",),
                         journal_location=JournalLocation.parse("s3://bucket/j"),
                         journal_options=(("aws_access_key_id", "AKIDEXAMPLE"),
                                          ("aws_secret_access_key", secret)))
    assert secret not in repr(opts)
    settings = opts.journal_settings()
    assert settings is not None
    journal = Journal.of(settings)
    assert secret not in repr(journal) and secret not in repr(journal.store)


def test_the_load_probe_refuses_a_store_that_ignores_conditional_create(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspark_kafka_share.errors import OptionError
    from pyspark_kafka_share.source.journal import probe

    objects: dict[str, bytes] = {}

    class Ignoring(stores.Store):
        renames = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def create_exclusive(self, path: str, data: bytes, fsync: bool) -> bool:
            objects[path] = data  # overwrites: no If-None-Match
            return True

        def read(self, path: str) -> bytes:
            return objects[path]

        def listdir(self, path: str) -> list[str]:
            return [k.rsplit("/", 1)[-1] for k in objects]

        def remove(self, path: str) -> None:
            objects.pop(path, None)

    monkeypatch.setattr(probe, "ObjectStore", Ignoring)
    with pytest.raises(OptionError, match="accepted a second exclusive create"):
        probe.check_journal(JournalLocation.parse("s3://bucket/ignoring"), {})
    assert objects == {}, "the probe object was left behind"


# -- journalPath on a filesystem: the probe at load() ------------------------------------------

_BASE = {"kafka.bootstrap.servers": "127.0.0.1:9", "kafka.group.id": "g", "subscribe": "t"}
_FIX = "Set journalPath to a directory that the driver and every executor can create files in"


def _tree(root: Path) -> list[str]:
    """Every path under ``root`` (what must be unchanged after a probe)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _refused(path: str) -> OptionError:
    """The error ``load()`` raises for ``journalPath`` = ``path`` (it parses the options)."""
    with pytest.raises(OptionError) as info:
        parse_options({**_BASE, "journalPath": path})
    assert info.value.option == "journalPath" and info.value.value == path
    assert _FIX in str(info.value), "the error must say what to do"
    return info.value


@pytest.mark.parametrize(("where", "cause"), [
    ("under-a-file", r"/plain is a file, not a directory, so the journal directory cannot be "),
    ("deep-under-a-file", r"/plain is a file, not a directory"),
    ("a-file", r"/plain exists and is not a directory"),
])
def test_a_journal_path_under_or_at_a_regular_file_is_refused_at_load(
    tmp_path: Path, where: str, cause: str,
) -> None:
    (tmp_path / "plain").write_text("not a directory")
    path = {"under-a-file": tmp_path / "plain" / "journal",
            "deep-under-a-file": tmp_path / "plain" / "a" / "journal",
            "a-file": tmp_path / "plain"}[where]
    before = _tree(tmp_path)
    for _ in range(2):  # every load() probes again: nothing is cached
        assert re.search(cause, str(_refused(str(path)))), "the error names the file"
    assert _tree(tmp_path) == before
    assert (tmp_path / "plain").read_text() == "not a directory"


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_a_journal_path_under_proc_is_refused_at_load() -> None:
    path = f"/proc/kafka-share-{os.getpid()}/journal"
    error = _refused(path)
    assert f"/proc refuses to create /proc/kafka-share-{os.getpid()}" in str(error)
    assert "virtual filesystem" in str(error)
    assert not os.path.lexists(os.path.dirname(path))


def test_a_read_only_journal_directory_is_refused_at_load(tmp_path: Path) -> None:
    with read_only_dir(tmp_path / "ro") as cause:
        error = _refused(str(tmp_path / "ro" / "journal"))
        assert cause in str(error)
        assert f"{tmp_path / 'ro'}" in str(error), "the error names the directory"
        assert os.listdir(tmp_path / "ro") == []


def test_a_usable_journal_path_is_probed_with_the_journals_own_operations_and_left_as_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, str]] = []
    for name in ("makedirs", "create_exclusive", "listdir", "read", "remove"):
        real = getattr(stores.LocalStore, name)

        def spy(self: Any, path: str, *args: Any, _name: str = name, _real: Any = real) -> Any:
            calls.append((_name, os.path.relpath(path, tmp_path)))
            return _real(self, path, *args)

        monkeypatch.setattr(stores.LocalStore, name, spy)
    (tmp_path / "existing").mkdir()
    parse_options({**_BASE, "journalPath": str(tmp_path / "new" / "dirs" / "journal")})
    ops = [op for op, _ in calls]
    assert ops == ["makedirs", "create_exclusive", "create_exclusive", "listdir", "read",
                   "remove"], ops
    probe = calls[1][1]
    assert probe.startswith("new/dirs/journal/.probe-") and calls[2][1] == probe
    assert _tree(tmp_path) == ["existing"], "the directories the probe created must go"
    calls.clear()
    parse_options({**_BASE, "journalPath": f"file://{tmp_path / 'existing'}"})
    assert len(calls) == 6, "every load() probes a filesystem journal"
    assert _tree(tmp_path) == ["existing"], "the probe file must go"


def test_the_probe_refuses_a_filesystem_whose_create_is_not_exclusive_or_not_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    def overwrite(self: Any, path: str, data: bytes, fsync: bool) -> bool:
        Path(path).write_bytes(data)  # replaces an existing file, as rename(2) would
        return True

    with monkeypatch.context() as m:
        m.setattr(stores.LocalStore, "create_exclusive", overwrite)
        error = _refused(str(tmp_path / "journal"))
    assert "accepted a second exclusive create" in str(error)
    with monkeypatch.context() as m:
        m.setattr(stores.LocalStore, "listdir", lambda self, path: [])
        error = _refused(str(tmp_path / "journal"))
    assert "missing from a listing" in str(error)
    assert _tree(tmp_path) == []


def test_an_hdfs_style_store_is_probed_too(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # ArrowFsStore (hdfs://, viewfs://) through pyarrow's local filesystem: its move()
    # replaces an existing file (HDFS's rename refuses one), which the probe must catch, and a
    # path under a file is refused as on a local path.
    def arrow_store(location: JournalLocation, options: Any = ()) -> tuple[stores.Store, str]:
        return stores.ArrowFsStore(location), location.path

    monkeypatch.setattr(probe, "store_for", arrow_store)
    error = _refused(f"file://{tmp_path / 'journal'}")
    assert "filesystem accepted a second exclusive create" in str(error)
    (tmp_path / "plain").write_text("x")
    error = _refused(f"file://{tmp_path / 'plain' / 'journal'}")
    assert f"{tmp_path / 'plain'} is a file, not a directory" in str(error)
    assert _tree(tmp_path) == ["plain"]


def _failing(real: Any, code: int, *, when: str, link: bool = False) -> Any:
    """``real`` (an ``os`` function), raising ``OSError(code)`` for paths containing ``when``."""
    def call(*args: Any, **kwargs: Any) -> Any:
        path = str(args[1] if link else args[0])
        if when in path:
            raise OSError(code, os.strerror(code), str(args[0]), None, path if link else None)
        return real(*args, **kwargs)

    return call


@pytest.mark.parametrize(("function", "code", "when", "cause"), [
    ("open", errno.EACCES, "/.tmp-", r"permission denied creating a file in {root}: user .+ "
                                     r"needs write access to {root}\. Set journalPath"),
    ("mkdir", errno.EROFS, "/journal", r"read-only file system: {tmp} is on a filesystem "
                                       r"mounted read-only"),
    ("mkdir", errno.ENOSPC, "/journal", r"no space left on the filesystem of {tmp}"),
    ("link", errno.EPERM, "/.probe-", r"this filesystem refuses hard links \(Operation not "
                                      r"permitted\), and the journal's exclusive create is "
                                      r"link\(2\)"),
    ("listdir", errno.EIO, "/journal", r"the journal directory is not usable: Input/output "
                                       r"error \({root}\)"),
])
def test_the_probe_names_the_cause_of_each_filesystem_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, function: str, code: int, when: str,
    cause: str,
) -> None:
    root = tmp_path / "journal"
    monkeypatch.setattr(os, function, _failing(getattr(os, function), code, when=when,
                                               link=function == "link"))
    error = _refused(str(root))
    monkeypatch.undo()
    assert re.search(cause.format(root=re.escape(str(root)), tmp=re.escape(str(tmp_path))),
                     str(error)), str(error)
    assert _tree(tmp_path) == [], "no directory, probe or temporary file may be left"


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write

    def full(fd: int, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space left"):
        stores.LocalStore().create_exclusive(str(tmp_path / "slot"), b"data", True)
    monkeypatch.setattr(os, "write", real)
    assert _tree(tmp_path) == []
