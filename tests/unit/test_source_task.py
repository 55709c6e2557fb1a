"""The source task's exactly-once loop against a scripted consumer and a local journal.

These drive the paths a real broker reaches only by chance: a redelivery of a record whose
acknowledgement was lost, a poll whose lock deadline has passed, a batch committed while a late
attempt polls, a commit confirmed for one partition only, an error record mid-task. The same
loop runs end to end in tests/integration/test_reader.py and test_source.py.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pyspark_kafka_share._kafka.arrow import messages_to_batch
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.pool import PooledConsumer
from pyspark_kafka_share._kafka.share import ShareSession
from pyspark_kafka_share.errors import BrokerError, JournalClosed, JournalError
from pyspark_kafka_share.source import task as task_module
from pyspark_kafka_share.source.faults import Faults
from pyspark_kafka_share.source.journal import replay as replay_module
from pyspark_kafka_share.source.journal.journal import Journal, ScanResult
from pyspark_kafka_share.source.journal.slots import CONTENTS, Content
from pyspark_kafka_share.source.options import parse_options
from pyspark_kafka_share.source.task import TaskSpec, _Fill, read_partition
from tests.unit.test_journal_replay import fake_kafka

from .fakes import FakeConsumer, Msg

IN0, IN1 = TopicPartition("in", 0), TopicPartition("in", 1)

SEQ = 1


@pytest.fixture(autouse=True, params=CONTENTS)
def content(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Content:
    """Every test runs on both journal contents; an ``offsets`` replay reads a fake log that
    holds, at every offset, the record ``Msg`` builds (as the scripted polls hand out)."""
    monkeypatch.setattr(replay_module, "read_offsets", fake_kafka())
    monkeypatch.setitem(_CONTENT, "content", request.param)
    return request.param  # type: ignore[no-any-return]


_CONTENT: dict[str, Content] = {"content": "offsets"}


class Consumer(FakeConsumer):
    """A FakeConsumer whose polls may run a hook first, and whose commits may fail for some
    partitions."""

    def __init__(self, polls: list[list[Msg]], *,
                 before_poll: Callable[[int], None] = lambda n: None,
                 failing: frozenset[int] = frozenset()) -> None:
        super().__init__(polls)
        self.before_poll = before_poll
        self.failing = failing
        self.polled = 0

    def poll(self, timeout: float) -> list[Msg]:
        if self.polls:
            self.polled += 1
            self.before_poll(self.polled)
        return super().poll(timeout)

    def commit_sync(self, timeout: float) -> dict[Any, Any]:
        return {TP(p): ("COORDINATOR_NOT_AVAILABLE" if p in self.failing else None)
                for p in (0, 1)}


class TP:
    def __init__(self, partition: int) -> None:
        self.topic, self.partition = "in", partition

    def __hash__(self) -> int:
        return self.partition


def _spec(journal: Path, lock_ms: int = 30_000, client: str = "librdkafka",
          retention_ms: int = 600_000) -> TaskSpec:
    opts = parse_options({"kafka.bootstrap.servers": "unused:9092", "kafka.group.id": "g",
                          "subscribe": "in", "journalPath": str(journal),
                          "pollTimeoutMs": "1000", "joinTimeoutMs": "0",
                          "consumerIdleTimeoutMs": "0", "journalFsync": "false",
                          "journalContent": _CONTENT["content"], "client": client,
                          "journalRetentionMs": str(retention_ms)})
    return TaskSpec(options=opts, seq=SEQ, part=0, parts=1, task_max_records=None, lock_ms=lock_ms)


def _journal(spec: TaskSpec) -> Journal:
    settings = spec.options.journal_settings()
    assert settings is not None
    return Journal(settings.location, fsync=False, content=settings.content,
                   retention_ms=settings.retention_ms)


def _fill(spec: TaskSpec, consumer: Consumer) -> tuple[_Fill, Journal]:
    journal = _journal(spec)
    log = journal.part_log(SEQ, 0)
    fill = _Fill(spec, journal, log, log.open(), attempt_id=7,
                 faults=Faults(None, seq=SEQ, part=0, attempt_number=0))
    return fill, journal


def _drive(run: Generator[pa.RecordBatch, None, ScanResult]) -> tuple[list[int], ScanResult]:
    """The offsets ``run`` yields, and the scan it returns."""
    emitted: list[int] = []
    while True:
        try:
            emitted += next(run).column("offset").to_pylist()
        except StopIteration as stop:
            return emitted, stop.value


def _run(spec: TaskSpec, consumer: Consumer, session: type[ShareSession] = ShareSession,
         ) -> tuple[_Fill, list[int], Any]:
    """Run the loop to its END; the offsets it emits and the END marker."""
    fill, journal = _fill(spec, consumer)
    pc = PooledConsumer(session(consumer, timeout_s=1.0), key=(), topics=("in",),
                        idle_timeout_s=0, uses=1)
    emitted, scan = _drive(fill.run(pc))
    log = journal.part_log(SEQ, 0)
    offsets = [o for slot in scan.data_slots
               for o in log.identities(slot).column("offset").to_pylist()]
    assert emitted == offsets, "the rows yielded while polling are the log's, in its order"
    assert consumer.closed, "a consumer that is not pooled is closed"
    return fill, offsets, scan.end


def test_a_redelivered_record_the_journal_holds_is_accepted_not_emitted_again(
        tmp_path: Path) -> None:
    # Poll 1 is journaled and ACCEPTed; its acknowledgement of offset 1 is "lost", so the
    # broker delivers it again (delivery count 2) beside a fresh record.
    consumer = Consumer([[Msg(0), Msg(1)], [Msg(1, dc=2), Msg(2)]])
    fill, offsets, end = _run(_spec(tmp_path / "j"), consumer)
    assert offsets == [0, 1, 2]
    assert fill.stats["duplicates_dropped"] == 1 and fill.stats["redelivered"] == 1
    assert end.records == 3 and list(end.acked_slots) == [0, 1]
    assert end.stats["journal_slots"] == 2, "records per slot: records / journal_slots"


def test_a_poll_past_its_lock_deadline_is_released_but_last_deliveries_are_kept(
        tmp_path: Path) -> None:
    # A 1 s lock at the default safety fraction leaves 0.5 s from acquisition, and records
    # count as acquired 0.5 s before the poll: every poll is past its deadline at once.
    consumer = Consumer([[Msg(0), Msg(1, dc=5), Msg(2)]])
    fill, offsets, end = _run(_spec(tmp_path / "j", lock_ms=1_000), consumer)
    assert consumer.acks == {0: "RELEASE", 1: "ACCEPT", 2: "RELEASE"}
    assert offsets == [1]  # on its last delivery: RELEASE would archive it, so it is kept
    assert fill.stats["released_lock_deadline"] == 2
    # released records still count for AvailableNow
    assert end.min_offsets == {TopicPartition("in", 0): 0}


class SlowFirstCommit(Consumer):
    """Its first ``commit_sync`` takes ``seconds`` (a loaded machine, a slow broker)."""

    def __init__(self, polls: list[list[Msg]], seconds: float, **kwargs: Any) -> None:
        super().__init__(polls, **kwargs)
        self.seconds = seconds

    def commit_sync(self, timeout: float) -> dict[Any, Any]:
        time.sleep(self.seconds)
        self.seconds = 0.0
        return super().commit_sync(timeout)


@pytest.mark.parametrize("slow", ["processed past its lock deadline",
                                  "acknowledged in more than pollTimeoutMs"])
def test_a_poll_of_duplicates_only_does_not_end_the_task(slow: str, tmp_path: Path) -> None:
    """A killed attempt journaled offsets 0-1 and never ACCEPTed them; their lock expired, and
    the retry's first poll holds only them. They are ACCEPTed, not emitted again, and the task
    polls on to journal the next poll, although the duplicates' poll was slow: processed past
    its lock deadline (3 s lock: 1 s from the poll's start; with nothing to journal the
    deadline guards nothing), or its lookup and ACCEPT took longer than pollTimeoutMs (1 s
    here: that is no time without records). The task used to stop there, leaving its share
    to a later batch; under Trigger.AvailableNow on Spark 4.0/4.1, to the next run."""
    late = slow.startswith("processed")
    spec = _spec(tmp_path / "j", lock_ms=3_000 if late else 30_000)
    killed = Journal(str(spec.options.journal_path), fsync=False).part_log(SEQ, 0)
    killed.open()
    assert killed.append(messages_to_batch([Msg(0), Msg(1)], False), attempt=3) == 0

    def sleep_in_first_poll(n: int) -> None:
        if late and n == 1:
            time.sleep(1.1)

    consumer = SlowFirstCommit([[Msg(0, dc=2), Msg(1, dc=2)], [Msg(2), Msg(3)]],
                               0.0 if late else 1.2, before_poll=sleep_in_first_poll)
    fill, offsets, end = _run(spec, consumer)
    assert consumer.acks == {0: "ACCEPT", 1: "ACCEPT", 2: "ACCEPT", 3: "ACCEPT"}
    assert offsets == [0, 1, 2, 3]  # the killed attempt's slot, then this attempt's
    assert fill.stats["duplicates_dropped"] == 2
    assert fill.stats["released_lock_deadline"] == 0 and end.records == 4


@pytest.mark.parametrize("retention_ms", [0, 600_000], ids=["old-attempt", "young-attempt"])
def test_a_batch_committed_while_a_late_attempt_polls_gets_its_records_back(
        tmp_path: Path, retention_ms: int) -> None:
    """Spark commits the batch (another attempt finished it) between this attempt's polls.
    Young (the default retention), its next create finds the log ENDed by the driver's
    commit. Old (no retention), its create succeeds (here the fence alone is raised: an
    object store whose batch the commit deleted), and the fence re-read after it sends the
    records back; the slot stays (Spark drops a late attempt's rows). Either way nothing of
    the second poll is ACCEPTed."""
    journal_dir = tmp_path / "j"

    def commit_before_second_poll(n: int) -> None:
        if n == 2 and retention_ms:
            Journal(str(journal_dir), fsync=False, retention_ms=retention_ms).commit(
                SEQ, dedup_retention_ms=3_600_000, parts=1)
        elif n == 2:
            (journal_dir / "committed").write_text(json.dumps({"seq": SEQ}))

    driver = Journal(str(journal_dir), fsync=False, retention_ms=retention_ms)
    driver.place_marker()
    driver.commit(SEQ - 1, dedup_retention_ms=3_600_000)  # a fence promising the retention
    consumer = Consumer([[Msg(0)], [Msg(1), Msg(2)]], before_poll=commit_before_second_poll)
    fill, _ = _fill(_spec(journal_dir, retention_ms=retention_ms), consumer)
    reads = _count_fence_reads(fill.journal)
    pc = PooledConsumer(ShareSession(consumer, timeout_s=1.0), key=(), topics=("in",),
                        idle_timeout_s=0, uses=1)
    emitted, scan = _drive(fill.run(pc))
    assert consumer.acks == {0: "ACCEPT", 1: "RELEASE", 2: "RELEASE"}
    assert fill.stats["released_closed"] == 2 and emitted == [0]
    assert scan.data_slots == ([0] if retention_ms else [0, 1])
    # young: no re-read after slot 0's create; old: after each of its two creates
    assert reads == ([] if retention_ms else [1, 1]), reads


def _count_fence_reads(journal: Journal) -> list[int]:
    """Make ``journal`` note a 1 for each read of the fence from now on; the list."""
    reads: list[int] = []
    read = journal.committed_seq

    def counted() -> int:
        reads.append(1)
        return read()

    journal.committed_seq = counted  # type: ignore[method-assign]
    return reads


def test_a_commit_confirmed_for_one_partition_only_leaves_the_slot_unacknowledged(
        tmp_path: Path) -> None:
    consumer = Consumer([[Msg(0, partition=0)], [Msg(5, partition=1), Msg(1, partition=0)]],
                        failing=frozenset({1}))
    fill, offsets, end = _run(_spec(tmp_path / "j"), consumer)
    assert offsets == [0, 5, 1]  # journaled: emitted whatever the broker confirmed
    assert fill.stats["commit_failures"] == 2  # every commit reports partition 1 failing
    assert list(end.acked_slots) == []  # its keys go to dedup/ at commit: redeliveries drop


def test_an_error_record_mid_task_fails_the_task_and_releases_the_rest_of_its_poll(
        tmp_path: Path) -> None:
    consumer = Consumer([[Msg(0)], [Msg(1), Msg(2, error="UNKNOWN_TOPIC_OR_PART")]])
    fill, journal = _fill(_spec(tmp_path / "j"), consumer)
    pc = PooledConsumer(ShareSession(consumer, timeout_s=1.0), key=(), topics=("in",),
                        idle_timeout_s=0, uses=1)
    with pytest.raises(BrokerError, match="UNKNOWN_TOPIC_OR_PART"):
        list(fill.run(pc))
    assert consumer.acks == {0: "ACCEPT", 1: "RELEASE"}
    assert journal.part_log(SEQ, 0).scan().end is None  # no END: a retry continues the log


class HoldingConsumer(Consumer):
    """Polls while records are unacknowledged, as the native consumer may; ``lost``: its
    count of lost acquisitions (read by :class:`LosingSession`)."""

    lost = 0

    def poll(self, timeout: float) -> list[Msg]:
        self.pending = []
        return super().poll(timeout)


def test_the_native_client_journals_several_polls_in_one_slot(tmp_path: Path) -> None:
    """Three full polls, then an empty one: one slot of all six records, ACCEPTed after it
    exists; librdkafka's loop journals the same polls in three slots."""
    polls = [[Msg(0), Msg(1)], [Msg(2), Msg(3)], [Msg(4), Msg(5)]]
    consumer = HoldingConsumer([list(p) for p in polls])
    _, offsets, end = _run(_spec(tmp_path / "n", client="native"), consumer)
    assert offsets == [0, 1, 2, 3, 4, 5]
    assert consumer.acks == dict.fromkeys(range(6), "ACCEPT")
    assert (end.stats["journal_slots"], end.stats["slot_polls"], end.data_slots) == (1, 3, 1)
    assert list(end.acked_slots) == [0]
    _, offsets, end = _run(_spec(tmp_path / "r"), Consumer([list(p) for p in polls]))
    assert offsets == [0, 1, 2, 3, 4, 5]
    assert (end.stats["journal_slots"], end.stats["slot_polls"]) == (3, 3)


def test_a_native_task_failing_while_it_holds_polls_releases_all_of_them(
        tmp_path: Path) -> None:
    consumer = HoldingConsumer([[Msg(0), Msg(1)], [Msg(2), Msg(3, error="UNKNOWN_TOPIC_OR_PART")]])
    fill, journal = _fill(_spec(tmp_path / "j", client="native"), consumer)
    pc = PooledConsumer(ShareSession(consumer, timeout_s=1.0), key=(), topics=("in",),
                        idle_timeout_s=0, uses=1)
    with pytest.raises(BrokerError, match="UNKNOWN_TOPIC_OR_PART"):
        list(fill.run(pc))
    assert consumer.acks == {0: "RELEASE", 1: "RELEASE", 2: "RELEASE"}, \
        "the held poll is given back with the failed one's other records"
    assert journal.part_log(SEQ, 0).scan().data_slots == []


class LosingSession(ShareSession):
    """A session whose consumer counts lost acquisitions as the native one does."""

    def acquisitions_lost(self) -> int:
        return int(getattr(self.consumer, "lost", 0))


def test_held_polls_whose_acquisitions_were_lost_are_given_back_not_journaled(
        tmp_path: Path) -> None:
    """The consumer lost a session while a poll was held (its records may be another task's
    by now): they are RELEASEd, not journaled; the poll taken after the loss is journaled."""
    def lose(n: int) -> None:
        if n == 2:
            consumer.lost = 1
    consumer = HoldingConsumer([[Msg(0), Msg(1)], [Msg(2), Msg(3)]], before_poll=lose)
    fill, offsets, end = _run(_spec(tmp_path / "j", client="native"), consumer, LosingSession)
    assert offsets == [2, 3]
    assert consumer.acks == {0: "RELEASE", 1: "RELEASE", 2: "ACCEPT", 3: "ACCEPT"}
    assert fill.stats["holds_lost"] == 1 and end.stats["journal_slots"] == 1


def test_a_hold_with_a_record_twice_is_given_back_not_journaled(tmp_path: Path) -> None:
    """Offset 1 came back in a later poll (released and acquired again while held): the slot
    would hold it twice, so the whole hold is given back as past its deadline."""
    consumer = HoldingConsumer([[Msg(0), Msg(1)], [Msg(1, dc=2), Msg(2)]])
    fill, offsets, _ = _run(_spec(tmp_path / "j", client="native"), consumer)
    assert offsets == []
    assert consumer.acks == {0: "RELEASE", 1: "RELEASE", 2: "RELEASE"}
    assert fill.stats["holds_lost"] == 1


def test_held_duplicates_give_their_budget_back_and_the_task_reads_its_share(
        tmp_path: Path) -> None:
    """A budget of 4: [0, 1] journaled; [0, 1] again (duplicates, ACCEPTed) spend the budget
    while held, and give it back once journaling finds them: the task goes on to [2, 3]."""
    spec = dataclasses.replace(_spec(tmp_path / "j", client="native"), task_max_records=4)
    consumer = HoldingConsumer([[Msg(0), Msg(1)], [], [Msg(0, dc=2), Msg(1, dc=2)],
                                [Msg(2), Msg(3)]])
    _, offsets, end = _run(spec, consumer)
    assert offsets == [0, 1, 2, 3] and end.records == 4
    assert consumer.acks == dict.fromkeys(range(4), "ACCEPT")


def test_a_native_share_that_fits_the_in_flight_limit_is_one_slot(tmp_path: Path) -> None:
    """Two tasks share one partition whose in-flight limit is 10 (5 each): a task with a
    budget of 6 holds it all (2 x 6 <= twice the limit), and the short poll that reads the
    last record joins the held one instead of taking a slot of its own; at the divided
    limit the same polls took two slots."""
    spec = dataclasses.replace(_spec(tmp_path / "j", client="native"), task_max_records=6,
                               parts=2, partitions=(IN0,), record_locks=10)
    polls = [[Msg(0), Msg(1), Msg(2), Msg(3), Msg(4)], [Msg(5)]]
    _, offsets, end = _run(spec, HoldingConsumer([list(p) for p in polls]))
    assert offsets == [0, 1, 2, 3, 4, 5]
    assert (end.stats["journal_slots"], end.stats["slot_polls"]) == (1, 2)
    crowded = dataclasses.replace(spec, parts=4, options=_spec(tmp_path / "k",
                                                               client="native").options)
    _, offsets, end = _run(crowded, HoldingConsumer([list(p) for p in polls]))
    assert offsets == [0, 1, 2, 3, 4, 5], "4 x 6 > 2 x 10: the divided limit, 2"
    assert (end.stats["journal_slots"], end.stats["slot_polls"]) == (2, 2)


def test_a_journal_the_driver_did_not_mark_fails_the_task_before_it_polls(
        tmp_path: Path) -> None:
    """A node-local (or relative) journalPath on a cluster: the driver's marker is not there,
    and the task fails before it takes a consumer, so nothing is acknowledged."""
    driver = Journal(str(tmp_path / "driver-host" / "j"), fsync=False)
    marker = driver.place_marker()
    driver.check_marker(marker)  # where the driver wrote it, it is found
    spec = dataclasses.replace(_spec(tmp_path / "executor-host" / "j"), journal_marker=marker)
    with pytest.raises(JournalError, match="not the same place on this executor host"):
        list(read_partition(spec))
    shared = dataclasses.replace(_spec(tmp_path / "driver-host" / "j"), journal_marker=marker)
    assert shared.journal().uri == driver.uri  # a shared journal passes the check


def test_a_task_stops_at_its_share_of_the_planned_backlog(tmp_path: Path) -> None:
    """A batch planned with a lag of 5 over 2 tasks gives each a budget of 3: the task stops
    after the poll that reaches it (whole polls: 2 + 2) and leaves the third poll unread,
    although records keep coming (a steady stream)."""
    from pyspark_kafka_share.source.offset import BatchOffset

    plan = BatchOffset(SEQ, parts=2, max_records=0, backlog=5)
    max_records, share = plan.task_share()
    assert (max_records, share) == (None, 3)
    spec = dataclasses.replace(_spec(tmp_path / "j"), parts=2, backlog_share=share)
    consumer = Consumer([[Msg(0), Msg(1)], [Msg(2), Msg(3)], [Msg(4), Msg(5)]])
    _, offsets, end = _run(spec, consumer)
    assert offsets == [0, 1, 2, 3] and end.records == 4
    assert dataclasses.replace(spec, task_max_records=1).record_budget == 1  # the smaller share


def test_an_offset_logged_before_backlog_shares_reads_as_unbounded() -> None:
    from pyspark_kafka_share.source.offset import BatchOffset

    old = BatchOffset.of({"seq": 4, "parts": 2, "max": 0})
    assert old == BatchOffset(4, 2, 0, None) and old.task_share() == (None, None)
    assert not old.ends
    assert BatchOffset.of(old.following(2, 7, None).json()) == BatchOffset(5, 2, 7, None)
    planned = old.following(2, 0, 12, {IN0: 40})
    assert BatchOffset.of(json.loads(json.dumps(planned.json()))) == planned
    assert BatchOffset(5, 4, 10, 9).task_share() == (3, 3)


def test_a_skewed_backlog_gives_a_task_what_its_consumer_may_be_assigned() -> None:
    """The broker assigns consumers partitions: the backlog on one of two partitions is one
    task's to read whole, not half of it (each batch then read half of what was left)."""
    from pyspark_kafka_share.source.offset import BatchOffset, backlog_share

    assert backlog_share(225, 2, [0, 225]) == 225
    assert backlog_share(900, 2, [450, 450]) == 450  # even: the even share
    assert backlog_share(100, 4, [0, 100]) == 50  # 2 consumers share each of 2 partitions
    assert backlog_share(100, 4, [10, 20, 30, 40, 0, 0, 0, 0]) == 70  # 2 partitions a task
    assert backlog_share(9, 4, []) == 3  # lags unknown: even
    assert backlog_share(3, 4, [0, 3]) == 2  # never below the even share, never above all
    plan = BatchOffset(0, 2).following(2, 0, 2000, {IN0: 2000}, lags=[0, 2000],
                                       polls_per_share=1)
    assert plan.task_share() == (None, 2000) and plan.json()["share"] == 2000
    assert BatchOffset.of(json.loads(json.dumps(plan.json()))) == plan
    assert plan.poll == 512  # from the even share (1,000), not 2,000's 1,024: spread per poll
    even = BatchOffset(3, 2).following(2, 0, 900, {IN0: 900}, lags=[450, 450])
    assert even.json()["share"] == 0 and even.task_share() == (None, 450)


def test_a_task_stops_after_the_poll_that_reaches_records_produced_after_the_plan(
        tmp_path: Path) -> None:
    """The partition ended at offset 3 when the batch was planned: the poll holding offset 3
    is the task's last (kept whole); offsets 4.. go to the next batch."""
    spec = dataclasses.replace(_spec(tmp_path / "j"), planned_ends={IN0: 3})
    consumer = Consumer([[Msg(0), Msg(1)], [Msg(2), Msg(3)], [Msg(4), Msg(5)]])
    fill, offsets, _ = _run(spec, consumer)
    assert offsets == [0, 1, 2, 3]
    assert fill.stats["ended_past_plan"] == 1
    other = dataclasses.replace(_spec(tmp_path / "j2"),
                                planned_ends={TopicPartition("other", 0): 0})
    _, offsets, _ = _run(other, Consumer([[Msg(0)], [Msg(1)]]))
    assert offsets == [0, 1]


def test_the_poll_size_is_about_a_quarter_of_a_task_share_and_only_grows() -> None:
    """A task polls about a quarter of its share at once (whole producer batches), so tasks
    that poll later still find theirs. After the first batch the size only grows, by 4x or
    more (a new size is a new pooled consumer joining the group)."""
    from pyspark_kafka_share.source.offset import MAX_POLL, MIN_POLL, BatchOffset, poll_size

    assert poll_size(1250, None) == 256  # 10,000 records over 8 tasks
    assert poll_size(10, None) == MIN_POLL
    assert poll_size(8 * MAX_POLL, None) == 0  # the consumer's own max.poll.records
    assert poll_size(None, None) == 0 and poll_size(None, 256) == 256  # unknown: as before
    assert poll_size(2500, 256) == 256 and poll_size(10, 256) == 256  # kept
    assert poll_size(2500, 128) == 512 and poll_size(100_000, 256) == 0
    first = BatchOffset(0, 8).following(8, 0, 20_000)
    assert first.poll == 512
    assert BatchOffset.of(first.json()) == first
    assert first.following(8, 0, 10_000).poll == 512  # share 1,250: want 256, within 4x
    assert first.following(8, 0, 4_000).poll == 512  # share 500: never shrinks
    assert first.following(8, 0, None).poll == 512


def test_a_task_polls_at_most_the_planned_poll_size(tmp_path: Path) -> None:
    spec = dataclasses.replace(_spec(tmp_path / "j"), poll_records=512)
    assert spec.consumer_recipe().confluent_config()["max.poll.records"] == "512"
    capped = dataclasses.replace(spec, task_max_records=100)  # maxRecordsPerTrigger's share
    assert capped.consumer_recipe().confluent_config()["max.poll.records"] == "100"
    assert dataclasses.replace(spec, poll_records=None).consumer_recipe().confluent_config()[
        "max.poll.records"] == "2000"


def test_a_backlog_within_what_was_produced_after_the_plan_holds_nothing_of_the_batch() -> None:
    from pyspark_kafka_share._kafka.group import Backlog

    ends = {IN0: 300, IN1: 40}
    assert Backlog(50, {IN0: 50, IN1: 0}).within(ends, {IN0: 350, IN1: 40})
    # one record of the plan is still waiting (or held by another task)
    assert not Backlog(51, {IN0: 51, IN1: 0}).within(ends, {IN0: 350, IN1: 40})
    assert not Backlog(None, {IN0: 0, IN1: None}).within(ends, {IN0: 300, IN1: 40})
    assert not Backlog(0, {IN0: 0, IN1: 0}).within({}, {})  # no plan: nothing to say
    assert not Backlog(0, {IN0: 0, IN1: 0}).within(ends, {IN0: 300})  # no watermark


def test_records_from_before_a_point_certainly_wait_only_when_the_lag_exceeds_what_came_after(
) -> None:
    from pyspark_kafka_share._kafka.group import Backlog

    start = {IN0: 300, IN1: 40}
    # 50 produced since on in:0: a lag of 51 holds at least one record from before the start
    assert Backlog(51, {IN0: 51, IN1: 0}).waiting_before(start, {IN0: 350, IN1: 40})
    assert not Backlog(50, {IN0: 50, IN1: 0}).waiting_before(
        start, {IN0: 350, IN1: 40})
    assert Backlog(None, {IN0: None, IN1: 1}).waiting_before(
        start, {IN0: 300, IN1: 40})
    # unknown lag or watermark: nothing is certain
    assert not Backlog(None, {IN0: None, IN1: None}).waiting_before(start, start)
    assert not Backlog(9, {IN0: 9, IN1: 0}).waiting_before(start, {IN1: 40})


@pytest.fixture
def yield_every_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """A task yields its rows after every poll (as it did before ``YIELD_ROWS``), so that a
    test of rows yielded mid-task needs only a few records."""
    monkeypatch.setattr(task_module, "YIELD_ROWS", 1)


def _polled_at_each_yield(spec: TaskSpec, consumer: Consumer) -> tuple[list[int], list[int]]:
    """How many polls the task had made when it yielded each batch, and the offsets."""
    fill, _ = _fill(spec, consumer)
    pc = PooledConsumer(ShareSession(consumer, timeout_s=1.0), key=(), topics=("in",),
                        idle_timeout_s=0, uses=1)
    polled: list[int] = []
    offsets: list[int] = []
    for batch in fill.run(pc):
        polled.append(consumer.polled)
        offsets += batch.column("offset").to_pylist()
    return polled, offsets


def test_a_task_yields_its_first_slot_at_once_then_doubling_up_to_yield_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task's first slot goes to Spark at once (work downstream starts on its first
    records, not after its whole share), then groups of twice the previous yield's rows up
    to ``YIELD_ROWS`` (or ``YIELD_BYTES``), not after every poll (that stalled each poll on
    Spark's Python worker: about 30 points of journal overhead in the throughput benchmark),
    and the rest at the task's end; the order stays the log's."""
    polls = [[Msg(10 * n + i) for i in range(4)] for n in range(9)]
    polled, offsets = _polled_at_each_yield(_spec(tmp_path / "a"), Consumer(polls))
    # 4 rows a poll (a batch per poll): yields of 4, 8 (polls 2-3) and 16 rows (polls 4-7),
    # the rest at the end
    assert polled == [1, 3, 3, 7, 7, 7, 7, 9, 9]
    assert offsets == [m.offset() for poll in polls for m in poll]

    monkeypatch.setattr(task_module, "YIELD_ROWS", 10)  # then every 10 rows: polls 3, 6, 9
    polled, _ = _polled_at_each_yield(_spec(tmp_path / "b"), Consumer(polls))
    assert polled == [1, 3, 3, 6, 6, 6, 9, 9, 9]

    monkeypatch.setattr(task_module, "YIELD_BYTES", 1)  # the bytes bound: after every poll
    polled, _ = _polled_at_each_yield(_spec(tmp_path / "c"), Consumer(polls[:5]))
    assert polled == [1, 2, 3, 4, 5]


def test_rows_are_yielded_while_the_task_polls_in_the_logs_order(
        tmp_path: Path, yield_every_poll: None) -> None:
    """Each poll's rows go downstream once journaled and ACCEPTed, before the next poll; a
    concurrent attempt's slot between two of ours is yielded in its place (from the journal),
    so the task yields what a re-run of the batch yields, in the same order."""
    spec = _spec(tmp_path / "j")

    def other_attempt_publishes(n: int) -> None:
        if n == 2:  # our poll 1 is in slot 0; a concurrent attempt takes slot 1
            other = _journal(spec).part_log(SEQ, 0)
            other.scan()
            assert other.append(messages_to_batch([Msg(50)], False), attempt=9) == 1

    consumer = Consumer([[Msg(0), Msg(1)], [Msg(2)]], before_poll=other_attempt_publishes)
    fill, _ = _fill(spec, consumer)
    pc = PooledConsumer(ShareSession(consumer, timeout_s=1.0), key=(), topics=("in",),
                        idle_timeout_s=0, uses=1)
    run = fill.run(pc)
    first = next(run)
    assert (first.column("offset").to_pylist(), consumer.polled) == ([0, 1], 1), \
        "the first poll's rows come before the second poll"
    assert consumer.acks == {0: "ACCEPT", 1: "ACCEPT"}, "and only after their ACCEPT"
    rest, scan = _drive(run)
    assert rest == [50, 2]
    assert scan.data_slots == [0, 1, 2] and scan.end is not None


def test_time_spent_downstream_does_not_end_the_task_as_if_no_record_came(
        tmp_path: Path, yield_every_poll: None) -> None:
    """A task waits in ``yield`` while Spark processes its rows; that wait is not "no record
    arrived for pollTimeoutMs" (1 s here), or a slow downstream would end every task after its
    first poll."""
    consumer = Consumer([[Msg(0)], [Msg(1)]])
    fill, _ = _fill(_spec(tmp_path / "j"), consumer)
    pc = PooledConsumer(ShareSession(consumer, timeout_s=1.0), key=(), topics=("in",),
                        idle_timeout_s=0, uses=1)
    run = fill.run(pc)
    assert next(run).column("offset").to_pylist() == [0]
    time.sleep(1.3)  # downstream is slow
    rest, scan = _drive(run)
    assert rest == [1], "the task ended after its first poll"
    assert scan.data_slots == [0, 1]


def test_a_task_whose_rows_spark_stops_pulling_ends_its_log(
        tmp_path: Path, yield_every_poll: None) -> None:
    """take() or show() in foreachBatch stops pulling rows: the log gets END over what was
    yielded, so the batch's content is fixed and a later action replays exactly that."""
    consumer = Consumer([[Msg(0), Msg(1)], [Msg(2)]])
    fill, journal = _fill(_spec(tmp_path / "j"), consumer)
    pc = PooledConsumer(ShareSession(consumer, timeout_s=1.0), key=(), topics=("in",),
                        idle_timeout_s=0, uses=1)
    run = fill.run(pc)
    next(run)
    run.close()
    scan = journal.part_log(SEQ, 0).scan()
    assert (scan.data_slots, scan.end is not None) == ([0], True)
    assert scan.end is not None and scan.end.records == 2
    assert consumer.polled == 1 and consumer.closed


def test_a_late_attempt_whose_batch_vanished_fails_instead_of_returning_its_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On an object store a late attempt can END a log whose slots the commit deleted (no
    directory vanishes there): the final scan then lacks the slots it yielded. It must fail,
    not return rows that differ from the log."""
    consumer = Consumer([[Msg(0)]])
    fill, _ = _fill(_spec(tmp_path / "j"), consumer)
    pc = PooledConsumer(ShareSession(consumer, timeout_s=1.0), key=(), topics=("in",),
                        idle_timeout_s=0, uses=1)
    emptied = ScanResult([], None, 0)
    monkeypatch.setattr(fill.log, "end", lambda marker_for: emptied)
    with pytest.raises(JournalClosed, match="committed while this attempt read it"):
        _drive(fill.run(pc))


def test_exactly_once_polls_up_to_a_whole_share_at_once() -> None:
    """Exactly-once plans polls of up to a task's share (the power of two at or below it), a
    journal slot each, where at-most-once plans a quarter; the other rules are the same."""
    from pyspark_kafka_share.source.offset import (
        EXACTLY_ONCE_POLLS_PER_SHARE,
        MAX_POLL,
        MIN_POLL,
        BatchOffset,
        poll_size,
    )

    once = EXACTLY_ONCE_POLLS_PER_SHARE
    assert poll_size(1250, None, once) == 1024  # 10,000 records over 8 tasks
    assert poll_size(1250, None) == 256  # at-most-once, as before
    assert poll_size(10, None, once) == MIN_POLL
    assert poll_size(MAX_POLL, None, once) == 0  # the consumer's own max.poll.records
    assert poll_size(1250, 256, once) == 1024 and poll_size(600, 256, once) == 256
    first = BatchOffset(0, 8).following(8, 0, 10_000, polls_per_share=once)
    assert first.poll == 1024
    assert first.following(8, 0, 1_000, polls_per_share=once).poll == 1024  # never shrinks


def test_the_tasks_shares_of_max_records_per_trigger_sum_to_it(tmp_path: Path) -> None:
    from pyspark_kafka_share.source.offset import BatchOffset

    plan = BatchOffset(0, 3).following(3, 1000, 10_000)
    shares = [plan.exact_share(i) for i in range(3)]
    assert shares == [334, 333, 333] and sum(s or 0 for s in shares) == 1000
    assert plan.task_share()[0] == 334, "the consumers' poll cap stays alike for every task"
    assert [BatchOffset(0, 4).following(4, 2, None).exact_share(i) for i in range(4)] == \
        [1, 1, 0, 0]
    assert BatchOffset(0, 2).following(2, 0, 100).exact_share(0) is None
    spec = dataclasses.replace(_spec(tmp_path / "j"), task_max_records=334, trigger_share=333,
                               backlog_share=5000)
    assert spec.record_budget == 333
    assert dataclasses.replace(spec, backlog_share=100).record_budget == 100
