"""The executor-side reader under races and broker failure.

Concurrent attempts of one task, as Spark's speculative execution runs them.

The executor-side reader is called directly (two threads, two pooled share consumers, one real
broker, one journal): no Spark scheduling decides the interleaving, so the race is real. The
race runs with the journal on each store and content (the ``journal`` fixture: a local
directory and ``s3://`` on LocalS3, ``offsets`` and ``records`` slots).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pyspark_kafka_share._kafka import pool as _pool
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share.errors import BrokerError
from pyspark_kafka_share.harness import ENV_BOOTSTRAP, LocalKafka, ProducerRecord
from pyspark_kafka_share.source.journal.journal import Journal
from pyspark_kafka_share.source.options import parse_options
from pyspark_kafka_share.source.task import TaskSpec, read_partition
from tests.fixtures.journal import JournalAt, assert_content
from tests.fixtures.kafka import ShareConsumerFactory, TopicFactory
from tests.helpers import Key, group_lag, poll_share, record_key, wait_for


def _keys(batches: list[pa.RecordBatch]) -> list[Key]:
    out: list[Key] = []
    for b in batches:
        out.extend(zip(b.column("topic").to_pylist(), b.column("partition").to_pylist(),
                       b.column("offset").to_pylist(), strict=True))
    return out


def _spec(kafka: LocalKafka, topic: str, group: str, journal: Path | JournalAt,
          **opts: str) -> TaskSpec:
    where = journal.source_options if isinstance(journal, JournalAt) else \
        {"journalPath": str(journal)}
    options = parse_options({
        "kafka.bootstrap.servers": kafka.bootstrap_servers, "kafka.group.id": group,
        "subscribe": topic, **where, "pollTimeoutMs": "1500",
        "kafka.max.poll.records": "200", **opts})
    return TaskSpec(options=options, seq=1, part=0, parts=1, task_max_records=None, lock_ms=30_000)


def _drain(kafka: LocalKafka, group: str, topic: str,
           share_consumer: ShareConsumerFactory) -> list[Key]:
    """What a fresh member of ``group`` gets (ACCEPTed) until 6 s pass without a record."""
    return [record_key(m) for m in poll_share(share_consumer(group, [topic]), quiet_s=6)]


def test_two_racing_attempts_yield_identical_rows_and_lose_nothing(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, journal: JournalAt,
    share_consumer: ShareConsumerFactory,
) -> None:
    topic = topic_factory(2)
    total = 6000
    kafka.produce(topic, (ProducerRecord(value=b"%d" % i, partition=i % 2) for i in range(total)),
                  producer_config={"batch.size": "2000"})
    spec = _spec(kafka, topic, group, journal)
    outputs: dict[str, list[Key]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def attempt(name: str) -> None:
        try:
            start.wait()
            outputs[name] = _keys(list(read_partition(spec)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=attempt, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    _pool.close_all()
    assert not errors, errors
    assert outputs["a"] == outputs["b"], "two attempts of one task yielded different rows"
    emitted = outputs["a"]
    assert not [k for k, c in Counter(emitted).items() if c > 1], "a record emitted twice"
    log = journal.open().part_log(1, 0)
    scan = log.scan()
    assert scan.end is not None
    writers = {log.writer(slot) for slot in scan.data_slots}
    assert len(writers) == 2, "only one attempt published: the race was not exercised"
    assert_content(journal, [(1, 0)])  # offsets: each read the other's slots back from Kafka
    # Whatever an attempt acquired after the other ENDed was RELEASEd, not lost:
    remaining = _drain(kafka, group, topic, share_consumer)
    assert not set(remaining) & set(emitted), "a record was both emitted and given back"
    assert sorted(emitted + remaining) == sorted(
        (topic, i % 2, i // 2) for i in range(total)), "a record was lost"


def _start_task_on_one_record(own: LocalKafka, name: str, journal: Path,
                              **opts: str) -> tuple[threading.Thread, list[object]]:
    """A task reading topic ``name`` (one record in it) in a thread, returned once it has
    journaled that record; the list gets its keys or its exception."""
    own.create_topic(name, 1)
    own.set_group_config(f"{name}-g", "share.auto.offset.reset", "earliest")
    own.produce(name, [b"first"])
    spec = _spec(own, name, f"{name}-g", journal, **opts)
    outcome: list[object] = []

    def task() -> None:
        try:
            outcome.append(_keys(list(read_partition(spec))))
        except BaseException as exc:  # noqa: BLE001 - the assertion reads it
            outcome.append(exc)

    thread = threading.Thread(target=task)
    thread.start()
    slot0 = journal / "batches" / "000000000001" / "00000" / "000000"
    deadline = time.monotonic() + 30
    while not slot0.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert slot0.exists(), "the task never journaled the first record"
    return thread, outcome


@pytest.mark.broker
@pytest.mark.skipif(bool(os.environ.get(ENV_BOOTSTRAP)), reason="stops its own broker")
def test_a_broker_that_dies_mid_task_is_an_error_not_an_empty_batch(tmp_path: Path) -> None:
    with LocalKafka() as own:
        thread, outcome = _start_task_on_one_record(
            own, "dies", tmp_path / "journal", pollTimeoutMs="60000",
            maxBatchDurationMs="60000", brokerTimeoutMs="5000")
        # The record acknowledged for good (the group's lag 0): the task is now polling an
        # idle topic. A condition, not a 1 s pause a loaded machine could outlast.
        wait_for(lambda: group_lag(own, "dies-g"), lambda lag: lag == 0, 60,
                 "the first record acknowledged")
        own.stop()
        thread.join(45)
    assert outcome, "the task did not end after its broker died"
    assert isinstance(outcome[0], BrokerError), f"expected BrokerError, got {outcome[0]!r}"
    assert "_ALL_BROKERS_DOWN" in str(outcome[0])


@pytest.mark.broker
@pytest.mark.skipif(bool(os.environ.get(ENV_BOOTSTRAP)), reason="restarts its own broker")
@pytest.mark.parametrize("client", ["librdkafka", "native"])
def test_a_task_rides_out_a_broker_restart(client: str, tmp_path: Path) -> None:
    """An outage shorter than brokerTimeoutMs is neither an error nor "no data": the task
    polls through it (its pollTimeoutMs and the drain probe wait) and reads on afterwards,
    with either share consumer (``client``)."""
    with LocalKafka() as own:
        thread, outcome = _start_task_on_one_record(
            own, "bounces", tmp_path / "journal", pollTimeoutMs="4000",
            maxBatchDurationMs="120000", brokerTimeoutMs="120000", client=client)
        own.kill()
        # The test's point is that time passes: twice pollTimeoutMs without a record, still
        # polling, not "no data". A loaded machine only makes the task slower to end, which
        # cannot fail this check.
        time.sleep(8)
        assert thread.is_alive(), f"the task ended during the outage: {outcome}"
        own.restart()
        thread.join(60)
    assert outcome, "the task did not end after its broker came back"
    assert not isinstance(outcome[0], BaseException), f"the task failed: {outcome[0]!r}"
    assert ("bounces", 0, 0) in outcome[0]  # type: ignore[operator]


@pytest.mark.parametrize("probe", [True, False])
def test_a_task_ends_once_the_group_is_drained(
    probe: bool, kafka: LocalKafka, topic_factory: TopicFactory, group: str, tmp_path: Path,
) -> None:
    topic = topic_factory(2)
    kafka.produce(topic, (ProducerRecord(value=b"%d" % i, partition=i % 2) for i in range(500)))
    spec = _spec(kafka, topic, group, tmp_path / "journal", pollTimeoutMs="6000",
                 joinTimeoutMs="0")
    if probe:
        spec = dataclasses.replace(
            spec, partitions=(TopicPartition(topic, 0), TopicPartition(topic, 1)))
    start = time.monotonic()
    rows = sum(b.num_rows for b in read_partition(spec))
    took = time.monotonic() - start
    _pool.close_all()
    assert rows == 500
    end = Journal(str(tmp_path / "journal")).part_log(1, 0).scan().end
    assert end is not None
    if probe:
        # Ended by the probe, which only runs before pollTimeoutMs passes without records (a
        # bound on the wall time would fail on a loaded machine, not on a broken probe).
        assert end.stats.get("ended_drained") == 1
    else:
        assert "ended_drained" not in end.stats
        assert took >= 6.0, took


@pytest.mark.parametrize("join_ms", [0, 8000])
def test_a_task_whose_share_others_took_ends_once_the_planned_records_are_acknowledged(
    join_ms: int, kafka: LocalKafka, topic_factory: TopicFactory, group: str, tmp_path: Path,
    share_consumer: ShareConsumerFactory,
) -> None:
    """Under a steady stream the backlog never empties. A task that finds the records planned
    for its batch taken by other members ends once no partition has more waiting than was
    produced after the plan, not ``pollTimeoutMs`` later; records produced after the plan
    (held here by another member) do not keep it waiting. A task whose consumer is new does
    not first wait ``joinTimeoutMs`` for an assignment that could bring nothing."""
    from confluent_kafka import AcknowledgeType

    topic = topic_factory(1)
    kafka.produce(topic, (ProducerRecord(value=b"%d" % i, partition=0) for i in range(300)))
    other = share_consumer(group, [topic])
    taken = 0
    deadline = time.monotonic() + 30
    while taken < 300 and time.monotonic() < deadline:  # another task takes the batch
        polled = other.poll(0.5)
        for m in polled:
            other.acknowledge(m, AcknowledgeType.ACCEPT)
        if len(polled):
            other.commit_sync()
        taken += len(polled)
    assert taken == 300
    kafka.produce(topic, (ProducerRecord(value=b"late", partition=0) for _ in range(50)))
    held: list[Any] = []
    while not held and time.monotonic() < deadline:  # produced after the plan, held
        held = list(other.poll(0.5))
    assert held
    spec = dataclasses.replace(
        _spec(kafka, topic, group, tmp_path / "journal", pollTimeoutMs="6000",
              joinTimeoutMs=str(join_ms)),
        partitions=(TopicPartition(topic, 0),), planned_ends={TopicPartition(topic, 0): 300})
    start = time.monotonic()
    rows = sum(b.num_rows for b in read_partition(spec))
    took = time.monotonic() - start
    _pool.close_all()
    for m in held:
        other.acknowledge(m, AcknowledgeType.RELEASE)
    other.commit_sync()
    assert rows == 0
    end = Journal(str(tmp_path / "journal")).part_log(1, 0).scan().end
    assert end is not None and end.stats.get("ended_drained") == 1, end  # before 6 s
    if join_ms:  # without the probe during the join: at least join_ms + 0.25 s
        assert took < join_ms / 1000 - 3, took


def _pooled_for(spec: TaskSpec) -> int:
    return len(_pool._IDLE.get(spec.consumer_recipe().key(), []))


def test_an_available_now_task_closes_its_consumer_where_a_streaming_one_pools_it(
    kafka: LocalKafka, topic: str, group: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under Trigger.AvailableNow batches follow back to back, and an idle pooled consumer
    would keep its partitions from the next batch's consumers in other Python workers: the
    task closes it instead (docs/design.md, "Idle consumers keep their partitions")."""
    from pyspark_kafka_share.source import task as task_module

    # Take the duration rule (tasks of 2 s or more close their consumer) out of the way.
    monkeypatch.setattr(task_module, "POOL_AFTER_TASKS_UNDER_S", 600.0)
    _pool.close_all()
    try:
        for available_now in (False, True):
            kafka.produce(topic, (ProducerRecord(value=b"%d" % i) for i in range(300)))
            spec = dataclasses.replace(_spec(kafka, topic, group, tmp_path / "journal"),
                                       seq=2 if available_now else 1,
                                       available_now=available_now)
            assert len(_keys(list(read_partition(spec)))) == 300
            ends = Journal(str(tmp_path / "journal")).batch_ends(spec.seq)
            pooled = ends[0].stats.get("consumers_pooled", 0)
            assert (pooled, _pooled_for(spec)) == ((0, 0) if available_now else (1, 1)), \
                f"available_now={available_now}: consumers_pooled={pooled}, " \
                f"pooled={_pooled_for(spec)}"
    finally:
        _pool.close_all()
