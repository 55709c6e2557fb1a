"""The retention of committed batches and the fence re-read it spares (issue 36): docs/design.md
("The fence re-read and the retention of committed batches").

The driver ENDs every log of a batch that has none before it raises the fence, and deletes a
committed batch only ``retention_ms`` after that; an attempt that opened its log (reading the
fence) less than half of that ago skips the fence re-read after a slot's create. Each test
fails when one piece is missing: the driver's END of open logs, the retention, the attempt's
age, or the sweep's batching.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from pyspark_kafka_share.errors import JournalClosed
from pyspark_kafka_share.source.journal import fencing
from pyspark_kafka_share.source.journal import journal as journal_module
from pyspark_kafka_share.source.journal.journal import Journal
from tests.fixtures.journal import JournalAt, Requests, end_marker, records_at

R = 600_000  # ms: the default journalRetentionMs


class _Clock:
    """A settable clock (seconds) for the journal's ages."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _fenced(journal: JournalAt, retention_ms: int = R) -> Journal:
    """A driver whose first commit (of batch 0) left a fence promising ``retention_ms``:
    tasks that open after it may skip their re-reads."""
    driver = journal.open(retention_ms=retention_ms)
    driver.place_marker()
    driver.commit(0, dedup_retention_ms=3_600_000, parts=0)
    return driver


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Clock]:
    fake = _Clock()
    monkeypatch.setattr(fencing, "clock", fake)
    monkeypatch.setattr(journal_module, "clock", fake)
    yield fake


def test_a_young_attempts_slot_costs_its_index_entry_the_slot_and_one_listing(
    journal: JournalAt, clock: _Clock,
) -> None:
    """Per poll of one topic-partition with fresh records: the lookup's listing, the index
    entry and the slot; no fence read while the attempt is younger than half the retention.
    Older, or with no retention, the task re-reads the fence after the create."""
    _fenced(journal)
    task = journal.open(retention_ms=R)
    log = task.part_log(1, 0)
    log.open()
    counting = Requests(task.store)
    task.store = counting  # type: ignore[assignment]
    assert task.find_journaled({("t", 0, 5)}) == set()
    log.append(records_at([("t", 0, 5)]), attempt=1)
    assert log.fence_holds()
    kinds = sorted(kind for kind, _ in counting.calls)
    assert kinds == ["create_exclusive", "create_exclusive", "list_after"], counting.calls
    clock.now += R / 2 / 1000 - 0.001
    assert log.fence_holds()
    clock.now += 0.002
    assert not log.fence_holds(), "an attempt older than half the retention must re-read"
    plain = journal.open()  # retention 0: delete at commit, re-read every slot
    other = plain.part_log(2, 0)
    other.open()
    other.append(records_at([("t", 0, 6)]), attempt=2)
    assert not other.fence_holds()
    late = journal.open(retention_ms=R).part_log(3, 0)
    late.open()
    clock.now += R / 2 / 1000
    late.append(records_at([("t", 0, 7)]), attempt=3)
    assert not late.fence_holds(), "the age counts from the open's fence read, not the create"


def test_after_the_commit_no_young_attempt_can_create_a_slot_in_the_batch(
    journal: JournalAt, clock: _Clock,
) -> None:
    """Task 0 ENDed its log; task 1's attempt opened its log and created nothing (Spark
    stopped it: a take() in foreachBatch); a speculative copy of task 0 is still polling.
    After the commit both are young: neither may publish a slot (it would skip the fence
    re-read and ACCEPT records the committed batch does not hold: lost). The driver ENDs task
    1's log before the fence, and keeps the batch until the retention has passed."""
    driver = _fenced(journal)
    done, copy = journal.open(retention_ms=R).part_log(1, 0), \
        journal.open(retention_ms=R).part_log(1, 0)
    done.open()
    copy.open()
    done.append(records_at([("t", 0, 1)]), attempt=1)
    done.end(end_marker(1, acked=(0,)))
    stopped = journal.open(retention_ms=R).part_log(1, 1)
    stopped.open()
    assert set(driver.batch_ends(1)) == {0}, "the metrics saw task 0's END only"
    driver.commit(1, dedup_retention_ms=3_600_000, parts=2)
    clock.now += R / 2 / 1000 - 1
    with pytest.raises(JournalClosed):
        stopped.append(records_at([("t", 1, 9)]), attempt=5)
    with pytest.raises(JournalClosed):
        copy.append(records_at([("t", 0, 2)]), attempt=2)
    closed = driver.part_log(1, 1).scan()
    assert closed.data_slots == [] and closed.end is not None and closed.end.attempt == -1


def test_committed_batches_go_after_the_retention_in_one_sweep(
    journal: JournalAt, clock: _Clock,
) -> None:
    """A committed batch stays for the retention, and is deleted by a sweep at most every
    half retention; on an object store one sweep lists the batches once and deletes them in
    one request, whatever their number. Index entries of fenced batches go with a sweep."""
    driver = _fenced(journal)
    for seq in (1, 2, 3):
        log = driver.part_log(seq, 0)
        log.open()
        log.append(records_at([("t", 0, seq)]), attempt=seq)
        log.end(end_marker(seq, acked=(0,)))
        driver.commit(seq, dedup_retention_ms=3_600_000, parts=1)
        clock.now += 60
    assert driver.batches() == [1, 2, 3], "a committed batch went before its retention"
    clock.now += R / 1000 - 180  # batch 1 is R old, 2 not; the last sweep R ago
    counting = Requests(driver.store)
    driver.store = counting  # type: ignore[assignment]
    log = driver.part_log(4, 0)
    log.open()
    log.end(end_marker(4))
    counting.calls.clear()
    driver.commit(4, dedup_retention_ms=3_600_000, parts=1)
    assert driver.batches() == [2, 3, 4]
    if journal.kind == "s3":
        batch_calls = [k for k, p in counting.calls if "/batches" in p and k != "read_head"]
        assert batch_calls.count("remove_all") == 1 and "remove_tree" not in batch_calls
    counting.calls.clear()
    clock.now += 60  # batch 2 is R old, but the last sweep was 60 s ago
    log = driver.part_log(5, 0)
    log.open()
    log.end(end_marker(5))
    driver.commit(5, dedup_retention_ms=3_600_000, parts=1)
    assert driver.batches() == [2, 3, 4, 5], "swept again before half the retention"
    clock.now += R / 1000
    driver.commit(5, dedup_retention_ms=3_600_000, parts=1)
    assert driver.batches() == []
    assert driver.store.files_under(driver._p("index")) == []


def test_a_new_driver_keeps_committed_batches_it_finds_for_the_retention(
    journal: JournalAt, clock: _Clock,
) -> None:
    """A restarted driver cannot know when the batches it finds were committed: it keeps
    them for the retention from its own first commit, so a young attempt of the old run
    still finds its log closed."""
    old = _fenced(journal)
    log = old.part_log(1, 0)
    log.open()
    log.end(end_marker(1))
    young = journal.open(retention_ms=R).part_log(1, 0)
    young.open()
    old.commit(1, dedup_retention_ms=3_600_000, parts=1)
    clock.now += R / 1000 - 1
    new = journal.open(retention_ms=R)
    new.commit(1, dedup_retention_ms=3_600_000, parts=1)
    assert new.batches() == [1]
    with pytest.raises(JournalClosed):
        young.append(records_at([("t", 0, 3)]), attempt=2)


def test_a_late_attempts_slot_does_not_count_as_journaled(journal: JournalAt) -> None:
    """Without retention the batch goes at the commit; an old attempt's create then lands in
    the emptied log (object stores) and it gives its records back: a lookup by a journal
    object that last read the fence before the commit must not take them for published."""
    task = journal.open()
    assert task.committed_seq() == -1
    late = journal.open().part_log(1, 0)
    late.open()
    driver = journal.open()
    driver.commit(1, dedup_retention_ms=3_600_000, parts=0)
    try:
        late.append(records_at([("t", 0, 4)]), attempt=3)
    except JournalClosed:
        assert journal.kind == "local", "only a filesystem's renamed directory refuses it"
        return
    assert not late.fence_holds()
    journal_module._KEY_CACHE.clear()
    assert task.find_journaled({("t", 0, 4)}) == set()


def test_the_driver_closes_nothing_more_when_every_task_ended(tmp_path: Any) -> None:
    """With every task's END seen by batch_ends, a commit that follows the fence (between
    sweeps) costs the fence's read and its write: no listing, no read of a log, no create."""
    j = Journal(str(tmp_path / "j"), fsync=False, retention_ms=R)
    j.place_marker()
    j.commit(0, dedup_retention_ms=0, parts=0)
    for part in range(3):
        log = j.part_log(1, part)
        log.open()
        log.append(records_at([("t", part, 1)]), attempt=1)
        log.end(end_marker(1, acked=(0,)))
    driver = Journal(str(tmp_path / "j"), fsync=False, retention_ms=R)
    assert set(driver.batch_ends(1)) == {0, 1, 2}
    driver.commit(1, dedup_retention_ms=0, parts=3)  # the first sweep
    counting = Requests(driver.store)
    driver.store = counting  # type: ignore[assignment]
    for part in range(3):
        log = j.part_log(2, part)
        log.open()
        log.end(end_marker(2))
    assert set(driver.batch_ends(2)) == {0, 1, 2}
    counting.calls.clear()
    driver.commit(2, dedup_retention_ms=0, parts=3)
    assert sorted(k for k, _ in counting.calls) == ["read", "write"], counting.calls


def test_the_fence_keeps_the_largest_retention_a_driver_promised(
    journal: JournalAt, clock: _Clock,
) -> None:
    """A restart with a lower journalRetentionMs (here 0) still keeps the batches for the
    retention the fence promised, since the old run's tasks rely on it; a task takes the
    smaller of its own and the fence's, and a task that opened without a fence skips
    nothing."""
    unfenced = journal.open(retention_ms=R).part_log(1, 0)
    unfenced.open()
    unfenced.append(records_at([("t", 0, 1)]), attempt=1)
    assert not unfenced.fence_holds(), "no fence, no promise: re-read"
    _fenced(journal)
    young = journal.open(retention_ms=R).part_log(1, 1)
    young.open()
    new = journal.open(retention_ms=0)
    new.commit(1, dedup_retention_ms=3_600_000, parts=2)
    assert new.batches() == [1], "deleted at once, under the old run's promise"
    with pytest.raises(JournalClosed):
        young.append(records_at([("t", 1, 2)]), attempt=2)
    wider = journal.open(retention_ms=4 * R).part_log(2, 0)
    wider.open()
    wider.append(records_at([("t", 0, 3)]), attempt=3)
    clock.now += R / 2 / 1000 + 1
    assert not wider.fence_holds(), "a task's window is at most the fence's promise"
    clock.now += R / 1000
    new.commit(2, dedup_retention_ms=3_600_000, parts=1)
    assert new.batches() == [2], "batch 1 went after the promised retention, batch 2 stays"


def test_a_commit_after_a_skipped_one_closes_the_skipped_batches_logs(
    journal: JournalAt, clock: _Clock,
) -> None:
    """Batch 1 (3 tasks, planned by this driver) and batch 2 (none of whose tasks created
    anything, planned before a restart) were never committed to the journal; the commit of
    batch 3 (2 tasks) closes every log of all three (batch 2 with the widest task count
    known), so no young attempt of them can publish after the fence."""
    driver = _fenced(journal)
    driver.planned(1, 3)
    attempts = []
    for seq, part in ((1, 2), (2, 2), (3, 1)):  # batch 2's part 2: beyond batch 3's tasks
        log = journal.open(retention_ms=R).part_log(seq, part)
        log.open()
        attempts.append(log)
    driver.commit(3, dedup_retention_ms=3_600_000, parts=2)
    for log in attempts:
        with pytest.raises(JournalClosed):
            log.append(records_at([("t", 0, 9)]), attempt=5)
    closed = driver.part_log(1, 2).scan()
    assert closed.end is not None and closed.end.attempt == -1


def test_a_task_whose_wall_clock_moved_on_is_old_though_its_monotonic_clock_stood_still(
    journal: JournalAt, clock: _Clock, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A virtual machine paused and resumed: CLOCK_BOOTTIME may have stood still, the wall
    clock moves on at the time sync. The larger age counts: the task re-reads the fence."""
    _fenced(journal)
    log = journal.open(retention_ms=R).part_log(1, 0)
    log.open()
    log.append(records_at([("t", 0, 1)]), attempt=1)
    assert log.fence_holds()
    wall = time.time() + R / 1000
    monkeypatch.setattr(time, "time", lambda: wall)
    assert not log.fence_holds(), "a paused machine's task took itself for young"
