"""The duplicate lookup through the journal's index (``source/journal/index.py``): one test per
race that docs/design.md ("The duplicate lookup") argues, each failing when the lookup skips a
candidate (a topic-partition's prefix, an entry at the edge of the listed range, the entry of
a slot won after a lost create, the fence read before a match is trusted), the requests one
slot costs, and the refusal at ``load()`` of a journal in the layout before the index.

"Another process" is simulated by clearing the per-process cache of slot keys: a process
knows another's slot only through the index and the slot itself.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from pyspark_kafka_share.errors import JournalClosed, OptionError
from pyspark_kafka_share.source.journal import journal as journal_module
from pyspark_kafka_share.source.journal.index import LAYOUT, IndexEntry, after
from pyspark_kafka_share.source.journal.journal import Journal
from pyspark_kafka_share.source.options import parse_options
from tests.fixtures.journal import JournalAt, Requests, end_marker, records_at

_BASE = {"kafka.bootstrap.servers": "127.0.0.1:9", "kafka.group.id": "g", "subscribe": "t"}


def _another_process() -> None:
    journal_module._KEY_CACHE.clear()


def test_a_poll_over_several_topic_partitions_finds_each_ones_journaled_records(
    journal: JournalAt,
) -> None:
    """The broker crash: journaled records whose ACCEPT was lost come back as first
    deliveries to any task, mixed with records of other partitions. Each topic-partition of
    the poll has its own prefix, and every one must be listed."""
    j = journal.open()
    log = j.part_log(1, 0)
    log.open()
    log.append(records_at([("a", 0, 5), ("b", 1, 7), ("b", 1, 8)]), attempt=1)
    _another_process()
    other = journal.open()
    poll = {("a", 0, 6), ("a", 0, 5), ("b", 1, 8), ("b", 2, 8)}
    assert other.find_journaled(poll) == {("a", 0, 5), ("b", 1, 8)}, \
        "a topic-partition's prefix was not searched"
    assert other.find_journaled({("b", 1, 7)}) == {("b", 1, 7)}


def test_a_slot_whose_range_starts_below_the_poll_is_listed(journal: JournalAt) -> None:
    """Entries are named by their highest offset first and listed from the poll's lowest one:
    a slot holding offsets below and at the poll's lowest offset is a candidate, and one
    whose highest offset is just below it is not even listed."""
    j = journal.open()
    log = j.part_log(1, 0)
    log.open()
    log.append(records_at([("t", 0, 3), ("t", 0, 10)]), attempt=1)
    log.append(records_at([("t", 0, 20)]), attempt=1)
    _another_process()
    other = journal.open()
    assert other.find_journaled({("t", 0, 10), ("t", 0, 11)}) == {("t", 0, 10)}
    assert other.find_journaled({("t", 0, 5), ("t", 0, 10), ("t", 0, 20)}) == \
        {("t", 0, 10), ("t", 0, 20)}
    assert other.find_journaled({("t", 0, 11), ("t", 0, 19)}) == set(), \
        "offsets inside a slot's range that it does not hold are not journaled"
    names = other.store.list_after(other._p("index", "t", "00000"), after(11))
    assert [IndexEntry.parse(n) for n in names] == \
        [IndexEntry(20, 20, "s", 1, 0, 1)], "the listing starts at the poll's lowest offset"


def test_racing_attempts_each_find_the_slot_they_won_after_a_lost_create(
    journal: JournalAt,
) -> None:
    """Two attempts of one partition log: B wins slot 0 that A announced, A publishes in slot
    1. A's announcement of slot 0 names B's slot (read on overlap, holding none of A's keys);
    A's records must be found through its entry of slot 1."""
    j = journal.open()
    a, b = j.part_log(1, 0), j.part_log(1, 0)
    a.open()
    b.open()
    assert b.append(records_at([("t", 0, 1)]), attempt=2) == 0
    assert a.append(records_at([("t", 0, 2)]), attempt=1) == 1  # a lost slot 0, took slot 1
    _another_process()
    other = journal.open()
    assert other.find_journaled({("t", 0, 1), ("t", 0, 2), ("t", 0, 3)}) == \
        {("t", 0, 1), ("t", 0, 2)}, "the slot won after a lost create was not indexed"


def test_a_zombies_orphan_slot_is_not_taken_for_published_with_a_stale_fence(
    journal: JournalAt,
) -> None:
    """The zombie: a late attempt of a committed batch creates a slot after the commit
    deleted the batch, and dies before withdrawing it; its records come back. A lookup by a
    journal object that last read the fence before the commit lists the orphan's entry above
    that fence: it must read the fence again before trusting the match."""
    task = journal.open()
    assert task.committed_seq() == -1  # the task's last fence read: before the commit
    driver = journal.open()
    log = driver.part_log(1, 0)
    log.open()
    log.append(records_at([("t", 0, 1)]), attempt=1)
    log.end(end_marker(1, acked=(0,)))
    driver.commit(1, dedup_retention_ms=3_600_000)
    zombie = journal.open()
    late = zombie.part_log(1, 0)
    zombie.store.makedirs(late.dir)  # a filesystem: the late attempt's open() re-created it
    with contextlib.suppress(JournalClosed):
        late.append(records_at([("t", 0, 7)]), attempt=9)  # no fence check: it dies here
    _another_process()
    assert task.find_journaled({("t", 0, 7), ("t", 0, 1)}) == set(), \
        "an orphan's records were taken for published ones (they would be dropped: lost)"


def test_unconfirmed_records_of_a_committed_batch_are_found_through_its_dedup_entries(
    journal: JournalAt,
) -> None:
    """After the commit the slots are gone; a redelivery of a record whose acknowledgement
    was not confirmed is found in the dedup entry under its topic-partition's prefix, by a
    journal object whose last fence read is older than the commit too."""
    task = journal.open()
    task.committed_seq()
    driver = journal.open()
    log = driver.part_log(1, 0)
    log.open()
    log.append(records_at([("a", 0, 5), ("b", 3, 9)]), attempt=1)  # not confirmed
    log.end(end_marker(1))
    driver.commit(1, dedup_retention_ms=3_600_000)
    _another_process()
    assert task.find_journaled({("a", 0, 5), ("b", 3, 9), ("b", 3, 10)}) == \
        {("a", 0, 5), ("b", 3, 9)}
    assert sorted((e.lo, e.hi) for e in driver.dedup_entries()) == [(5, 5), (9, 9)], \
        "one dedup entry per topic-partition"


def test_one_slot_costs_its_index_entry_create_one_fence_read_and_one_listing(
    tmp_path: Path,
) -> None:
    """Per poll of one topic-partition with fresh records: the lookup's listing (no fence
    read, no slot read while nothing overlaps), the index entry, the slot, the fence
    re-check: whatever the number of slots other tasks and processes wrote."""
    j = Journal(str(tmp_path / "j"), fsync=False)
    for part in range(8):  # other tasks' slots, of other offsets
        other = j.part_log(1, part)
        other.open()
        other.append(records_at([("t", 0, 100 + part)]), attempt=part)
    _another_process()
    task = Journal(str(tmp_path / "j"), fsync=False)
    log = task.part_log(1, 9)
    log.open()
    task.committed_seq()
    counting = Requests(task.store)
    task.store = counting  # type: ignore[assignment]
    for poll in range(3):
        counting.calls.clear()
        keys = {("t", 0, 1_000 + poll)}
        assert task.find_journaled(keys) == set()
        log.append(records_at(sorted(keys)), attempt=9)
        assert task.committed_seq() == -1
        kinds = [kind for kind, _ in counting.calls if kind != "makedirs"]
        assert sorted(kinds) == ["create_exclusive", "create_exclusive", "list_after",
                                 "read"], counting.calls
        assert [p for k, p in counting.calls if k == "read"] == [task._p("committed")]


def test_a_journal_of_the_layout_before_the_index_is_refused_at_load(tmp_path: Path) -> None:
    old = tmp_path / "old"
    (old / "dedup").mkdir(parents=True)
    (old / "committed").write_text('{"seq": 4}')
    with pytest.raises(OptionError) as info:
        parse_options({**_BASE, "journalPath": str(old)})
    assert info.value.option == "journalPath"
    assert "new checkpoint" in str(info.value) and "new journalPath" in str(info.value)
    slots_only = tmp_path / "slots-only"
    (slots_only / "batches" / "000000000003" / "00000").mkdir(parents=True)
    (slots_only / "batches" / "000000000003" / "00000" / "000000").write_bytes(b"ARROW1")
    with pytest.raises(OptionError, match="new checkpoint"):
        parse_options({**_BASE, "journalPath": str(slots_only)})
    other = tmp_path / "other"
    other.mkdir()
    (other / "layout").write_bytes(b"index-0")
    with pytest.raises(OptionError, match="layout 'index-0'"):
        parse_options({**_BASE, "journalPath": str(other)})
    fresh = tmp_path / "fresh"
    parse_options({**_BASE, "journalPath": str(fresh)})  # empty: accepted
    j = Journal(str(fresh))
    j.place_marker()  # the driver marks the layout
    assert (fresh / "layout").read_bytes() == LAYOUT
    j.part_log(1, 0).open()
    j.commit(1, dedup_retention_ms=0)
    parse_options({**_BASE, "journalPath": str(fresh)})  # this layout, in use: accepted
    driverless = tmp_path / "driverless"  # tasks of this version without a driver (tests)
    log = Journal(str(driverless)).part_log(1, 0)
    log.open()
    log.append(records_at([("t", 0, 1)]), attempt=1)
    parse_options({**_BASE, "journalPath": str(driverless)})


def test_the_driver_reads_each_ended_log_once_per_batch(tmp_path: Path) -> None:
    """batch_ends lists the batch once and reads each log's last slot, its END, in one
    ranged read; commit then reuses those scans (nothing is published after END) and lists
    the batch once more."""
    j = Journal(str(tmp_path / "j"), fsync=False)
    for part in range(4):
        log = j.part_log(1, part)
        log.open()
        log.append(records_at([("t", part, 1)]), attempt=1)
        log.end(end_marker(1, acked=(0,)))
    driver = Journal(str(tmp_path / "j"), fsync=False)
    counting = Requests(driver.store)
    driver.store = counting  # type: ignore[assignment]
    assert set(driver.batch_ends(1)) == {0, 1, 2, 3}
    assert sorted(k for k, _ in counting.calls) == ["files_under"] + ["read_head"] * 4, \
        counting.calls
    counting.calls.clear()
    driver.commit(1, dedup_retention_ms=0)
    assert [k for k, _ in counting.calls].count("read_head") == 0, counting.calls
    assert [p for k, p in counting.calls if k == "files_under"][:1] == [driver.batch_dir(1)]
    assert driver.batches() == []


def test_a_task_costs_its_start_one_end_create_and_one_driver_read(journal: JournalAt) -> None:
    """Per task and micro-batch, polls aside: the start (the fence, then one read of slot 0,
    which misses: the log is empty), END (one create, at the slot the task knows to be next)
    and the driver's metrics (one ranged read of the log's last slot, its END). A retry's
    start, which finds slot 0, scans the log as well."""
    j = journal.open()
    counting = Requests(j.store)
    j.store = counting  # type: ignore[assignment]
    log = j.part_log(1, 0)
    log.open()
    assert counting.calls == [("read", j._p("committed")), ("read_head", log.slot_path(0))], \
        counting.calls
    log.append(records_at([("t", 0, 5)]), attempt=1)
    counting.calls.clear()
    final = log.end(end_marker(1, acked=(0,)))
    assert final.data_slots == [0] and final.next_slot == 1 and final.end is not None
    assert counting.calls == [("create_exclusive", log.slot_path(1))], counting.calls
    driver = journal.open()
    counting = Requests(driver.store)
    driver.store = counting  # type: ignore[assignment]
    ends = driver.batch_ends(1)
    assert ends[0] == final.end
    assert sorted(k for k, _ in counting.calls) == ["files_under", "read_head"], counting.calls
    counting = Requests(j.store)
    j.store = counting  # type: ignore[assignment]
    retry = j.part_log(1, 0)
    assert retry.open().end == final.end
    assert sorted(k for k, _ in counting.calls) == ["listdir", "read", "read_head", "read_head"], \
        counting.calls


def test_end_at_the_known_slot_falls_back_to_the_log_when_that_slot_is_taken(
    journal: JournalAt,
) -> None:
    """END goes to the first free slot whoever took the one this attempt knew: after a
    concurrent attempt's slot it lands behind it (and counts it), after a concurrent END that
    END stands; a log with a gap (a slot deleted by a sweep under way) is scanned first."""
    j = journal.open()
    a, b = j.part_log(1, 0), j.part_log(1, 0)
    a.open()
    b.open()
    a.append(records_at([("t", 0, 1)]), attempt=1)
    b.append(records_at([("t", 0, 2)]), attempt=2)  # slot 1, a's known next
    final = a.end(end_marker(1))
    assert (final.data_slots, final.next_slot) == ([0, 1], 2)
    assert final.end is not None and final.end.data_slots == 2
    again = b.end(end_marker(2))
    assert again.end == final.end, "the first END stands"
    c = j.part_log(2, 0)
    c.open()
    c.append(records_at([("t", 0, 3)]), attempt=3)
    j.store.remove(c.slot_path(c.append(records_at([("t", 0, 4)]), attempt=3)))
    c._next_known = False  # what a task that knew of the gap would do: scan first
    gapped = c.end(end_marker(3))
    assert (gapped.data_slots, gapped.next_slot) == ([0], 1), "END fills the gap"


def test_a_worker_reads_the_owner_before_it_would_create_it(journal: JournalAt) -> None:
    """claim() in a process that has not checked the owner yet reads it: an owned journal costs
    one read, not a refused create and a read; another query's journal is still refused."""
    j = journal.open()
    j.claim("q1")
    journal_module._CLAIMED.clear()  # another worker process
    counting = Requests(j.store)
    j.store = counting  # type: ignore[assignment]
    j.claim("q1")
    assert counting.calls == [("read", j._p("owner"))], counting.calls
    journal_module._CLAIMED.clear()
    with pytest.raises(Exception, match="belongs to streaming query q1"):
        j.claim("q2")


def test_a_host_checks_the_marker_and_the_owner_once_per_run(
    journal: JournalAt, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Spark's Python workers come and go: a new worker process on a host where another
    passed the checks of this run (the driver's marker, the owner) asks the store nothing; a
    new run (a new marker), or another host, checks again."""
    driver = journal.open()
    marker = driver.place_marker()
    first = journal.open()
    first.check_marker(marker)
    first.claim("q1")
    journal_module._MARKERS_SEEN.clear()  # another process of the same host
    journal_module._CLAIMED.clear()
    again = journal.open()
    counting = Requests(again.store)
    again.store = counting  # type: ignore[assignment]
    again.check_marker(marker)
    again.claim("q1")
    assert counting.calls == [], counting.calls
    journal_module._MARKERS_SEEN.clear()
    journal_module._CLAIMED.clear()
    run = driver.place_marker()  # a new run
    again.check_marker(run)
    again.claim("q1")
    assert counting.calls == [("read", again._p("markers", run)),
                              ("read", again._p("owner"))], counting.calls
    journal_module._MARKERS_SEEN.clear()
    journal_module._CLAIMED.clear()
    monkeypatch.setattr(journal_module, "_HOST_DIR", tmp_path / "another-host")
    counting.calls.clear()
    other = journal.open()
    other.store = counting  # type: ignore[assignment]
    other.check_marker(marker)
    with pytest.raises(Exception, match="belongs to streaming query q1"):
        other.claim("q2")
    assert sorted(k for k, _ in counting.calls) == ["read", "read"], counting.calls
