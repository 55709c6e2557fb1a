"""The kafka-share source against a real broker and a real local Spark.

Every guarantee test injects its failure for real (an exception in the task, the Python worker
process killed with os._exit, an expired lock, a failed batch and a restart from the
checkpoint) and then checks that the sink holds every produced record exactly once. Those
taking the ``journal`` fixture run with the journal on each store (a local directory and
``s3://`` on LocalS3, tests/fixtures/journal.py) and read it through the package's
``Journal``.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from confluent_kafka import AcknowledgeType, Message
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

import pyspark_kafka_share as ks
from pyspark_kafka_share.errors import JournalError
from pyspark_kafka_share.harness import LocalKafka, ProducerRecord
from pyspark_kafka_share.source.journal.journal import Journal
from tests.fixtures.journal import JOURNAL_MATRIX, JournalAt, assert_content
from tests.fixtures.kafka import ShareConsumerFactory, TopicFactory
from tests.helpers import (
    Key,
    assert_exactly_once,
    drain_available_now,
    fails_within,
    group_lag,
    poll_share,
    produce_spread,
    read_only_dir,
    record_key,
    run_available_now,
    share_stream,
    sink_keys,
    spread_keys,
    start_parquet,
    wait_for,
)


def _published(j: Journal, seq: int, part: int) -> int:
    """Data slots in the log of ``(seq, part)`` (0 while it does not exist), on any store."""
    try:
        return len(j.part_log(seq, part).scan().data_slots)
    except (FileNotFoundError, JournalError):
        return 0


def _batch_stats(j: Journal, queries: Sequence[StreamingQuery]) -> dict[int, dict[str, int]]:
    """Every finished batch's counters (summed over its tasks) by the source's batch number:
    from the progress of ``queries`` (a trigger that plans a batch reports the one before it
    as ``lastBatch``), and from the END markers the journal still holds for the batches no
    later trigger reported (the last of a run). The journal alone forgets: a batch's commit
    deletes its END markers, and its dedup entries go once the group's start offsets pass
    them."""
    stats: dict[int, dict[str, int]] = {}
    for q in queries:
        for p in q.recentProgress:
            report = ks.progress(p)
            if report is not None and "batch" in report.last_batch:
                stats[report.last_batch["batch"]] = report.last_batch
    for seq in j.batches():
        ends = j.batch_ends(seq)
        if seq not in stats and ends:
            totals: Counter[str] = Counter()
            for end in ends.values():
                totals["records"] += end.records
                totals.update(end.stats)
            stats[seq] = dict(totals)
    return stats


def _assert_killed_attempts_records_recognised(j: Journal,
                                               queries: Sequence[StreamingQuery]) -> None:
    """Batch 1's killed attempt journaled records it never acknowledged (the END marker's
    attempt, its retry, acknowledged only what it polled itself: batch 1's ``records`` less
    its ``accepted`` fresh ones), and every one of them, redelivered, was recognised as a
    duplicate by some batch of ``queries`` (``duplicates_dropped``), whichever batch read
    them and whether or not the journal still holds it."""
    stats = _batch_stats(j, queries)
    first = stats.get(1)
    assert first is not None, f"batch 1's counters are neither reported nor journaled: {stats}"
    killed = first.get("records", 0) - \
        (first.get("accepted", 0) - first.get("duplicates_dropped", 0))
    assert killed > 0, "the killed attempt left no journaled record unacknowledged (did it " \
        f"publish nothing, its poll released at the lock deadline?): batches {stats}"
    dropped = sum(s.get("duplicates_dropped", 0) for s in stats.values())
    assert dropped >= killed, f"the killed attempt journaled {killed} records; {dropped} " \
        f"redelivered ones were recognised as duplicates: batches {stats}"


def _remaining(kafka: LocalKafka, group: str, topics: list[str],
               share_consumer: ShareConsumerFactory, wait_s: float = 8.0) -> list[Key]:
    """What a plain consumer of the group still gets (and RELEASEs back)."""
    c = share_consumer(group, topics)
    return [record_key(m) for m in poll_share(c, AcknowledgeType.RELEASE, timeout_s=wait_s)]


def _librdkafka(*values: str) -> object:
    """A test's cell with the source on librdkafka (``client=librdkafka``), the other client
    than the default (``native``): in ``make test``, not in the version tiers (marker
    ``client_variant``: CI's minutes)."""
    return pytest.param(*values, "librdkafka", id="-".join((*values, "librdkafka")),
                        marks=pytest.mark.client_variant)


# -- reading ---------------------------------------------------------------------------------


@pytest.mark.spark_subset
@pytest.mark.kafka_subset
def test_more_tasks_than_partitions_exactly_once(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path
) -> None:
    expected = produce_spread(kafka, topic, 1, 20_000)
    df = share_stream(spark, kafka, [topic], group, tmp_path / "journal", numPartitions=4)
    from pyspark.sql.functions import spark_partition_id

    run_available_now(df.withColumn("task", spark_partition_id()), tmp_path / "out",
                      tmp_path / "chk")
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)


def test_columns_headers_nulls_large_values_several_topics(
    spark: SparkSession, kafka: LocalKafka, topic_factory: TopicFactory, group: str, tmp_path: Path
) -> None:
    a, b = topic_factory(2), topic_factory(1)
    big = b"x" * 500_000
    kafka.produce(a, [
        ProducerRecord(value=b"v1", key=b"k1", headers=[("h1", b"x"), ("h2", None)], partition=0),
        ProducerRecord(value=None, key=None, partition=1),
        ProducerRecord(value=big, key=b"big", partition=0, timestamp_ms=1_700_000_000_000),
    ])
    kafka.produce(b, [ProducerRecord(value=b"other", key=b"k")])
    df = share_stream(spark, kafka, [a, b], group, tmp_path / "journal", includeHeaders="true")
    assert [f.name for f in df.schema.fields] == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
        "headers", "deliveryCount"]
    run_available_now(df, tmp_path / "out", tmp_path / "chk")
    rows = {(r.topic, r.partition, r.offset): r for r in
            spark.read.parquet(str(tmp_path / "out")).collect()}
    assert len(rows) == 4
    first = rows[(a, 0, 0)]
    assert (bytes(first.key), bytes(first.value)) == (b"k1", b"v1")
    assert [(h.key, None if h.value is None else bytes(h.value)) for h in first.headers] == [
        ("h1", b"x"), ("h2", None)]
    assert first.deliveryCount == 1 and first.timestampType == 0
    nulls = rows[(a, 1, 0)]
    assert nulls.key is None and nulls.value is None
    large = rows[(a, 0, 1)]
    assert bytes(large.value) == big
    assert int(large.timestamp.timestamp() * 1000) == 1_700_000_000_000
    assert bytes(rows[(b, 0, 0)].value) == b"other"


def test_sql_over_a_temp_view_and_catalog_tables(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path
) -> None:
    expected = produce_spread(kafka, topic, 1, 300)
    # The SQL path that works: a temp view over the streaming DataFrame.
    view = f"v_{group.replace('-', '_')}"
    share_stream(spark, kafka, [topic], group, tmp_path / "journal").createOrReplaceTempView(view)
    df = spark.sql(f"SELECT topic, partition, offset FROM {view} WHERE value IS NOT NULL")
    run_available_now(df, tmp_path / "out", tmp_path / "chk")
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)
    # CREATE TABLE validates its OPTIONS at once ...
    table = f"share_{group.replace('-', '_')}"
    with pytest.raises(Exception, match="journalPath"):
        spark.sql(f"CREATE TABLE {table}_bad USING `kafka-share` OPTIONS ("
                  f"'kafka.bootstrap.servers' '{kafka.bootstrap_servers}', "
                  f"'kafka.group.id' '{group}', 'subscribe' '{topic}')")
    spark.sql(
        f"CREATE TABLE {table} USING `kafka-share` OPTIONS ("
        f"'kafka.bootstrap.servers' '{kafka.bootstrap_servers}', 'kafka.group.id' '{group}', "
        f"'subscribe' '{topic}', 'journalPath' '{tmp_path / 'journal2'}')"
    )
    # ... but PySpark 4.3 hands a streaming read of it no options: the error says what to do.
    with pytest.raises(Exception, match="createOrReplaceTempView"):
        q = (spark.sql(f"SELECT * FROM STREAM {table}").writeStream.format("noop")
             .option("checkpointLocation", str(tmp_path / "chk2")).start())
        q.awaitTermination(60)


@pytest.mark.client_variant
def test_max_records_per_trigger_bounds_batches_with_librdkafka(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path
) -> None:
    # One record per producer batch: librdkafka's polls acquire whole batches (the native
    # client's are strict: the next test).
    kafka.produce(topic, (b"%d" % i for i in range(600)),
                  producer_config={"batch.size": "1", "linger.ms": "0"})
    df = share_stream(spark, kafka, [topic], group, tmp_path / "journal", numPartitions=2,
                      maxRecordsPerTrigger=100, client="librdkafka")
    q = run_available_now(df, tmp_path / "out", tmp_path / "chk")
    sizes = [p.numInputRows for p in q.recentProgress if p.numInputRows]
    assert sum(sizes) == 600
    assert max(sizes) <= 100, sizes
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), spread_keys(topic, 1, 600))


@pytest.mark.needs_spark_4_2
def test_max_records_per_trigger_is_exact_with_the_native_client(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path
) -> None:
    """Producer batches of 1,000 records, tasks' shares of 750: librdkafka's polls acquire
    whole batches (a batch of 2,000 where 1,500 were asked); the native client's strict
    record_limit polls, each capped by what is left of the task's share, read exactly
    maxRecordsPerTrigger per batch. The native client is the source's default."""
    kafka.produce(topic, (b"%d" % i for i in range(6000)),
                  producer_config={"batch.num.messages": "1000", "batch.size": "10000000",
                                   "linger.ms": "2000"})
    df = share_stream(spark, kafka, [topic], group, tmp_path / "journal", numPartitions=2,
                      maxRecordsPerTrigger=1500)
    q = run_available_now(df, tmp_path / "out", tmp_path / "chk")
    sizes = [p.numInputRows for p in q.recentProgress if p.numInputRows]
    assert sizes == [1500] * 4, sizes
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), spread_keys(topic, 1, 6000))


def test_a_batch_reads_the_backlog_it_was_planned_with_not_the_whole_stream(
    spark: SparkSession, kafka: LocalKafka, topic_factory: TopicFactory, group: str,
    tmp_path: Path
) -> None:
    """Under a steady stream the lag never reads 0 and records never stop arriving, so a task
    bounded by time alone polls for maxBatchDurationMs (here 600 s): no batch would finish in
    the 300 s below. Each task's share of the lag planned with its batch ends it instead."""
    topic = topic_factory(2)
    stop = threading.Event()
    sent = [0]

    def stream() -> None:
        from confluent_kafka import Producer

        p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5})
        while not stop.is_set():
            for _ in range(10):
                p.produce(topic, b"v%d" % sent[0], partition=sent[0] % 2)
                sent[0] += 1
            p.poll(0)
            time.sleep(0.2)  # 50 records/s: the source keeps up on a loaded machine
        p.flush(30)

    producer = threading.Thread(target=stream)
    producer.start()
    q = None
    try:
        df = share_stream(spark, kafka, [topic], group, tmp_path / "journal", numPartitions=2,
                          maxBatchDurationMs=600_000)
        q = start_parquet(df, tmp_path / "out", tmp_path / "chk")
        # Three batches with rows, waited for: a task bounded by time alone ends its batch
        # after maxBatchDurationMs (600 s), so it finishes none in 300 s, while the planned
        # backlog ends each in seconds (three in under 20 s on an idle machine; with stress-ng
        # beside it and 200 records/s, batch 0 took 80 s, its backlog grown while Spark
        # started).
        finished = wait_for(lambda: [p for p in q.recentProgress if p.numInputRows],
                            lambda done: len(done) >= 3, 300, "three batches with rows")
        assert len(finished) >= 3, [p.durationMs.get("addBatch") for p in finished]
    finally:
        stop.set()
        producer.join(60)
    assert q is not None
    try:
        wait_for(lambda: len(set(sink_keys(spark, tmp_path / "out"))),
                 lambda n: n >= sent[0], 120, "the query reading the rest of the stream")
    finally:
        q.stop()
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), spread_keys(topic, 2, sent[0]))


def test_two_queries_in_one_group_split_without_overlap(
    spark: SparkSession, kafka: LocalKafka, topic_factory: TopicFactory, group: str, tmp_path: Path
) -> None:
    topic = topic_factory(2)
    expected = produce_spread(kafka, topic, 2, 10_000)
    queries = []
    for name in ("q1", "q2"):
        df = share_stream(spark, kafka, [topic], group, tmp_path / name / "journal",
                          numPartitions=2)
        queries.append(start_parquet(df, tmp_path / name / "o", tmp_path / name / "c",
                                     available_now=True))
    for q in queries:
        q.awaitTermination(240)
        assert q.exception() is None
    got1 = sink_keys(spark, tmp_path / "q1" / "o")
    got2 = sink_keys(spark, tmp_path / "q2" / "o")
    assert not set(got1) & set(got2), "a record went to both queries"
    assert_exactly_once(got1 + got2, expected)


def test_at_most_once_reads_without_journal(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path
) -> None:
    expected = produce_spread(kafka, topic, 1, 500)
    df = share_stream(spark, kafka, [topic], group, None, delivery="at-most-once")
    seen: list[Key] = []
    lock = threading.Lock()

    def collect(batch: DataFrame, batch_id: int) -> None:
        with lock:
            seen.extend((r.topic, r.partition, r.offset) for r in batch.collect())

    q = df.writeStream.foreachBatch(collect).option(
        "checkpointLocation", str(tmp_path / "chk")).start()
    deadline = time.monotonic() + 120
    while len(seen) < 500 and time.monotonic() < deadline:
        time.sleep(0.5)
    q.stop()
    assert_exactly_once(seen, expected)


# -- failures ---------------------------------------------------------------------------------


# fail-before-publish: the failed attempt journals nothing, so its retry replays no slot and
# neither the store nor the content plays a part (one cell); fail-before-end: every cell.
@pytest.mark.spark_subset
@pytest.mark.kafka_subset
@pytest.mark.parametrize(("point", "journal", "client"),
                         [pytest.param("fail-before-publish", "local-offsets", "native",
                                       id="fail-before-publish-local-offsets"),
                          *(pytest.param("fail-before-end", cell, "native",
                                         id=f"fail-before-end-{cell}") for cell in JOURNAL_MATRIX),
                          _librdkafka("fail-before-end", "local-offsets")],
                         indirect=["journal"])
def test_a_failed_task_attempt_is_retried_exactly_once(
    point: str, client: str, spark: SparkSession, kafka: LocalKafka,
    topic_factory: TopicFactory, group: str, tmp_path: Path, journal: JournalAt,
    share_consumer: ShareConsumerFactory,
) -> None:
    """Attempt 0 of a task fails before publishing a poll (it RELEASEs what it polled) or
    before END (after it yielded rows: rows go downstream while a task polls, Spark drops a
    failed attempt's output, and the retry yields the log's data slots, the failed attempt's
    included). Either way the sink holds each record once."""
    topic = topic_factory(2)
    # No lock has to expire here. A short lock would make the retry's new consumer release
    # records again: its first records come from a fetch that may have started with a poll
    # blocked by the group join (2-3 s here), and the lock deadline counts from there (1.5 s
    # with a 3 s lock). On Spark 4.0 AvailableNow is one batch, so they would be left for the
    # next run.
    kafka.set_group_config(group, "share.record.lock.duration.ms", 10_000)
    expected = produce_spread(kafka, topic, 2, 4000)
    df = share_stream(spark, kafka, [topic], group, journal, numPartitions=2, client=client,
                      _faultInjection=f"{point}:seq=1:part=0:attempt=0")
    if point == "fail-before-publish":
        # The failed attempt RELEASEs its polls as best it can; what it could not comes back
        # when its lock expires. A CI rehearsal on PySpark 4.0.5 (one micro-batch per
        # AvailableNow run) left 976 records of the failed partition unread, likely such
        # records (not proven). On 4.0/4.1 the next run reads them, as the docs' recipe does.
        drain_available_now(spark, df, tmp_path / "out", tmp_path / "chk", expected)
    else:  # the failed attempt published and ACCEPTed its polls: nothing is left locked
        run_available_now(df, tmp_path / "out", tmp_path / "chk")
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)
    assert _remaining(kafka, group, [topic], share_consumer, wait_s=4) == []
    if point == "fail-before-end":
        log = journal.open(fsync=False).part_log(1, 0)
        scan = log.scan()
        assert scan.end is not None, "batch 1 is gone from the journal: the test cannot check"
        assert {log.writer(s) for s in scan.data_slots} - {scan.end.attempt}, \
            "no slot of the failed attempt (so it yielded no rows): the test proves nothing"
        # offsets: the retry read the failed attempt's records back from Kafka.
        assert_content(journal, [(1, 0)])
    else:
        assert_content(journal)


# Each store with each content. Not journalFsync=false: a killed process keeps the page cache,
# so that run took the same path as this one but for the fsync calls (the option's plumbing is
# the unit tests'; the bench runs it end to end).
@pytest.mark.spark_subset
@pytest.mark.kafka_subset
@pytest.mark.parametrize(("journal", "fsync", "client"),
                         [*(pytest.param(cell, "true", "native", id=f"{cell}-true")
                            for cell in JOURNAL_MATRIX),
                          _librdkafka("local-offsets", "true")],
                         indirect=["journal"])
def test_worker_killed_after_publish_before_ack_loses_and_duplicates_nothing(
    fsync: str, client: str, spark: SparkSession, kafka: LocalKafka, topic: str, group: str,
    tmp_path: Path, journal: JournalAt, share_consumer: ShareConsumerFactory,
) -> None:
    kafka.set_group_config(group, "share.record.lock.duration.ms", KILLED_LOCK_MS)
    expected = produce_spread(kafka, topic, 1, 3000)
    # The native client holds several polls in one slot (up to the group's in-flight limit,
    # 2,000 by default): polls of 200 make the killed attempt hold ten fetches unacknowledged.
    native = {"kafka.max.poll.records": NATIVE_POLL} if client == "native" else {}
    # One task, so the killed task surely holds records.
    df = share_stream(spark, kafka, [topic], group, journal, numPartitions=1, journalFsync=fsync,
                      client=client, **native,
                      _faultInjection="kill-after-publish:seq=1:part=0:attempt=0")
    runs = [run_available_now(df, tmp_path / "out", tmp_path / "chk")]
    assert_content(journal)
    # The killed attempt's journaled records were never acknowledged: once their lock expires
    # they are redelivered, and a batch must recognise and ACCEPT them without emitting them.
    df2 = share_stream(spark, kafka, [topic], group, journal, numPartitions=2, journalFsync=fsync,
                       client=client, **native)
    runs += _run_until_drained(kafka, group, df2, tmp_path / "out", tmp_path / "chk")
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)
    assert _remaining(kafka, group, [topic], share_consumer, wait_s=6) == [], \
        "redelivered duplicates were not acknowledged"
    _assert_killed_attempts_records_recognised(journal.open(), runs)
    if client == "native":
        _assert_slots_of_several_fetches(journal.open(), runs)


NATIVE_POLL = 200


def _assert_slots_of_several_fetches(j: Journal, queries: Sequence[StreamingQuery]) -> None:
    """Batch 1 as the native client journaled it in polls of ``NATIVE_POLL`` records: the
    killed attempt, killed right after its first slot, journaled more than one poll's records
    there (it died holding several fetches, none acknowledged: batch 1's ``records`` less what
    its retry ACCEPTed fresh), and the batches after it published fewer slots than they held
    polls."""
    batches = _batch_stats(j, queries)
    first = batches.get(1)
    assert first is not None, "batch 1's counters are neither reported nor journaled"
    killed = first.get("records", 0) - \
        (first.get("accepted", 0) - first.get("duplicates_dropped", 0))
    assert killed > NATIVE_POLL, \
        f"the killed attempt's one slot holds {killed} records, not several polls: {first}"
    slots = sum(b.get("journal_slots", 0) for b in batches.values())
    polls = sum(b.get("slot_polls", 0) for b in batches.values())
    assert polls > slots > 0, f"{slots} slots of {polls} polls: batches {batches}"


# The killed-after-publish tests' lock. A poll must be journaled within lockSafetyFraction x
# lock - 0.5 s of its start, or it is RELEASEd and the task stops: then the kill, which
# follows the journal write, never happens. 3 s (1 s to journal 1,338 records) and then 6 s
# (2.5 s) were too short on a loaded 2-core machine; the lock's length costs nothing while
# nothing is killed, and once the attempt is killed the test waits for its locks to expire.
KILLED_LOCK_MS = 20_000


def _run_until_drained(kafka: LocalKafka, group: str, df: DataFrame, out: Path, chk: Path,
                       timeout_s: float = 300) -> list[StreamingQuery]:
    """Run ``df`` into the Parquet sink at ``out`` with an AvailableNow trigger, again while
    the group's lag is not 0 (at most ``timeout_s``, then the caller's checks decide); the
    runs. A run waits for records from before its start that another member holds, the dead
    attempt's among them, until their locks expire; a broker late to expire them costs a run,
    not the verdict."""
    runs = [run_available_now(df, out, chk)]
    deadline = time.monotonic() + timeout_s
    while group_lag(kafka, group) != 0 and time.monotonic() < deadline:
        runs.append(run_available_now(df, out, chk))
    return runs


# A broker of its own per run (72 s on the loaded machine): each store and each content once
# (the lookup that recognises the redelivered records reads slot keys, which both contents
# hold; the store's listing and reads are what differ, and the killed-worker test above runs
# every cell of the same lookup).
# The default cells run the native client (issue 39 item 5): its slot may hold several polls,
# and the crash drops its share sessions while the slot's records are unacknowledged.
@pytest.mark.kafka_subset
@pytest.mark.needs_spark_4_2
@pytest.mark.parametrize(("journal", "client"),
                         [pytest.param("local-offsets", "native", id="local-offsets"),
                          pytest.param("s3-records", "native", id="s3-records"),
                          _librdkafka("local-offsets")],
                         indirect=["journal"])
def test_broker_crash_between_publish_and_ack_duplicates_nothing(
    spark: SparkSession, tmp_path: Path, journal: JournalAt, client: str,
) -> None:
    """The broker keeps an acquisition's delivery count in memory only: killed after a slot
    was published and before its ACCEPT, it hands those records out again as first deliveries
    (deliveryCount 1). The journal must still recognise them."""
    from confluent_kafka import ShareConsumer

    with LocalKafka() as own:
        topic = own.create_topic(f"t-crash-{os.getpid()}", 1)
        group = f"g-crash-{os.getpid()}"
        own.set_group_config(group, "share.auto.offset.reset", "earliest")
        expected = produce_spread(own, topic, 1, 3000)
        df = share_stream(spark, own, [topic], group, journal, numPartitions=2, client=client,
                          _faultInjection="sleep-after-publish:seq=1:part=0:attempt=0:ms=20000")
        q = start_parquet(df, tmp_path / "out", tmp_path / "chk", available_now=True)
        try:
            j = journal.open(fsync=False)
            deadline = time.monotonic() + 120
            while not _published(j, 1, 0):
                assert time.monotonic() < deadline, "partition 0 never published a slot"
                assert q.isActive, f"the query ended early: {q.exception()}"
                time.sleep(0.2)
            own.kill()  # the slot is journaled, its ACCEPT not sent: acquisitions are lost
            own.restart()
            assert_content(journal, [(1, 0)])
            q.awaitTermination(240)
            assert not q.isActive, "the AvailableNow query did not finish"
        finally:
            with contextlib.suppress(Exception):
                q.stop()
        if q.exception() is not None:
            # The other task's retries may all fall into the outage: the query stops with
            # BrokerError, and the user restarts it from its checkpoint.
            assert "BrokerError" in str(q.exception()), q.exception()
            df = share_stream(spark, own, [topic], group, journal, numPartitions=2,
                              client=client)
            run_available_now(df, tmp_path / "out", tmp_path / "chk")
        got = spark.read.parquet(str(tmp_path / "out"))
        assert_exactly_once([(r.topic, r.partition, r.offset) for r in got.collect()],
                            expected)
        made: list[ShareConsumer] = []

        def consumer(g: str, topics: list[str], /, **conf: str) -> ShareConsumer:
            c = ShareConsumer({"bootstrap.servers": own.bootstrap_servers, "group.id": g,
                               "share.acknowledgement.mode": "explicit", **conf})
            c.subscribe(topics)
            made.append(c)
            return c

        try:
            assert _remaining(own, group, [topic], consumer, wait_s=6) == []
        finally:
            for c in made:
                c.close()


def test_expired_lock_releases_instead_of_publishing(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path
) -> None:
    kafka.set_group_config(group, "share.record.lock.duration.ms", 2000)
    expected = produce_spread(kafka, topic, 1, 1000)
    df = share_stream(spark, kafka, [topic], group, tmp_path / "journal", numPartitions=2,
                      _faultInjection="sleep-before-publish:seq=1:ms=2500")
    # AvailableNow must not stop on a batch that released the backlog: it reads it again.
    run_available_now(df, tmp_path / "out", tmp_path / "chk")
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)
    counts = {r.deliveryCount for r in spark.read.parquet(str(tmp_path / "out")).collect()}
    assert max(counts) >= 2, "no record was released and redelivered"


def test_available_now_waits_for_records_another_member_holds(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path,
    share_consumer: ShareConsumerFactory,
) -> None:
    """Records from before the start that another member of the group holds (an idle pooled
    consumer's fetch, another application) give a batch nothing; AvailableNow must not take
    that empty batch for the end, but read them once they are released."""
    held = produce_spread(kafka, topic, 1, 500)
    other = share_consumer(group, [topic])
    got: list[Message] = []
    deadline = time.monotonic() + 30
    while not got:
        assert time.monotonic() < deadline, "the other member never got the first records"
        got = list(other.poll(1.0))
    produce_spread(kafka, topic, 1, 2500)
    assert {record_key(m) for m in got} <= held
    df = share_stream(spark, kafka, [topic], group, tmp_path / "journal", numPartitions=2)
    q = start_parquet(df, tmp_path / "out", tmp_path / "chk", available_now=True)
    try:
        # Hold the records until a batch has come back without any of them.
        wait_for(lambda: (q.isActive, [(p.batchId, p.numInputRows) for p in q.recentProgress]),
                 lambda v: not v[0] or any(b >= 1 and n == 0 for b, n in v[1]), timeout_s=180,
                 what="a batch that read nothing while the records were held")
        stopped_early = not q.isActive
        other.close()  # releases what it held
        q.awaitTermination(180)
        assert not q.isActive, "the AvailableNow query did not finish"
    finally:
        with contextlib.suppress(Exception):
            q.stop()
    assert q.exception() is None, q.exception()
    keys = sink_keys(spark, tmp_path / "out")
    assert not stopped_early or len(keys) == 3000, \
        f"AvailableNow stopped with {3000 - len(keys)} records from before its start held"
    assert_exactly_once(keys, spread_keys(topic, 1, 3000))


def _backlog_with_3s_locks(kafka: LocalKafka, topic_factory: TopicFactory, group: str,
                          n: int) -> tuple[str, set[Key]]:
    """A new topic of 2 partitions holding ``n`` records (and their keys); ``group``'s record
    locks last 3 s, so that what a failed or stopped attempt held comes back soon."""
    topic = topic_factory(2)
    kafka.set_group_config(group, "share.record.lock.duration.ms", 3000)
    return topic, produce_spread(kafka, topic, 2, n)


def test_failed_batch_restarted_from_checkpoint_replays_exactly(
    spark: SparkSession, kafka: LocalKafka, topic_factory: TopicFactory, group: str, tmp_path: Path,
    journal: JournalAt,
) -> None:
    topic, expected = _backlog_with_3s_locks(kafka, topic_factory, group, 6000)
    # Every attempt of task 0 of batch 1 fails before END: the query dies mid-batch, after
    # both tasks may have journaled and ACCEPTed records.
    df = share_stream(spark, kafka, [topic], group, journal, numPartitions=2,
                      _faultInjection="fail-before-end:seq=1:part=0")
    q = start_parquet(df, tmp_path / "out", tmp_path / "chk", available_now=True)
    with pytest.raises(Exception, match="injected failure: fail-before-end"):
        q.awaitTermination(240)
    assert_content(journal)  # something was journaled (or the test proves nothing)
    df2 = share_stream(spark, kafka, [topic], group, journal, numPartitions=2)
    run_available_now(df2, tmp_path / "out", tmp_path / "chk")
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)


@pytest.mark.spark_subset
@pytest.mark.kafka_subset
def test_query_stopped_mid_batch_and_restarted_from_checkpoint(
    spark: SparkSession, kafka: LocalKafka, topic_factory: TopicFactory, group: str, tmp_path: Path,
    journal: JournalAt,
) -> None:
    topic, expected = _backlog_with_3s_locks(kafka, topic_factory, group, 4000)
    # Task 0 of batch 1 is held before END (after journaling and acknowledging what it read)
    # while the test stops the query.
    df = share_stream(spark, kafka, [topic], group, journal, numPartitions=2,
                      _faultInjection="sleep-before-end:seq=1:part=0:ms=60000")
    q = start_parquet(df, tmp_path / "out", tmp_path / "chk")
    part0, part1 = (journal.open().part_log(1, part) for part in (0, 1))
    deadline = time.monotonic() + 120  # only guards a hang
    # task 1 ENDed and task 0 journaled a slot (it then sleeps before its END): on a busy
    # machine task 0 may start after task 1 ended, and a stop before its slot left none
    while part1.scan().end is None or not part0.scan().data_slots:
        assert time.monotonic() < deadline, "batch 1's tasks did not journal in 120 s"
        assert q.isActive, f"the query ended before it could be stopped mid-batch: {q.exception()}"
        time.sleep(0.2)
    assert q.isActive, "the query ended before it could be stopped mid-batch"
    q.stop()
    # The file sink commits a batch in its metadata log (Spark batch 0 is our seq 1); files
    # of finished tasks may be on disk but are not part of the table.
    assert not (tmp_path / "out" / "_spark_metadata" / "0").exists(), \
        "the batch was committed to the sink: the stop did not interrupt it"
    assert_content(journal)
    df2 = share_stream(spark, kafka, [topic], group, journal, numPartitions=2)
    # 4.0/4.1: the restart's one micro-batch replays batch 1 and may leave the rest to a next run
    drain_available_now(spark, df2, tmp_path / "out", tmp_path / "chk", expected)
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)


# The restart replays the killed batch from the journal: both contents; the store's part of
# that replay is the restarted-query tests' (every cell).
@pytest.mark.parametrize("journal", ["local-offsets", "local-records"], indirect=True)
def test_foreach_batch_keyed_by_batch_id_is_exactly_once_across_a_crash(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path,
    journal: JournalAt,
) -> None:
    kafka.set_group_config(group, "share.record.lock.duration.ms", 3000)
    expected = produce_spread(kafka, topic, 1, 2000)
    sink = tmp_path / "sink"

    checked: list[int] = []  # data slots whose content was checked, per batch

    def write(batch: DataFrame, batch_id: int) -> None:  # idempotent per batch id
        batch.select("topic", "partition", "offset").write.mode("overwrite").parquet(
            str(sink / f"batch={batch_id}"))
        # The batch's slots exist until the source commits it, when the next batch starts: a
        # run's last batch may be an empty one, so the content is checked here, not at the end.
        checked.append(assert_content(journal, require=False))

    def got() -> list[Key]:
        return [(r.topic, r.partition, r.offset) for r in spark.read.parquet(str(sink)).collect()]

    # The crash, then runs once the killed attempt's 3 s locks expired (the test's point: time
    # passes) until the sink holds every record: a loaded broker may expire them late, and a
    # run before that finds them still locked.
    faults = ["kill-after-publish:seq=1:part=1:attempt=0", None, None, None, None]
    for fault in faults:
        opts = {"_faultInjection": fault} if fault else {}
        df = share_stream(spark, kafka, [topic], group, journal, numPartitions=2, **opts)
        q = (df.writeStream.foreachBatch(write).option("checkpointLocation", str(tmp_path / "c"))
             .trigger(availableNow=True).start())
        q.awaitTermination(240)
        assert q.exception() is None
        if not fault and not expected - set(got()):
            break
        time.sleep(4)
    assert sum(checked), f"no batch had a data slot in {journal.url}: the test cannot tell " \
        "what content it ran on"
    assert_exactly_once(got(), expected)


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.spark_subset
@pytest.mark.parametrize(("options", "message"), [
    ({"journalPath": None}, "journalPath"),
    ({"subscrbe": "x"}, "did you mean 'subscribe'"),
    ({"kafka.auto.offset.reset": "earliest"}, "startingOffsets"),
    ({"kafka.enable.auto.commit": "true"}, "kafka.enable.auto.commit"),
    ({"numPartitions": "0"}, "numPartitions"),
    ({"journalPath": "s3://bucket/j"}, "atomic"),
    ({"startingOffsets": '{"t":{"0":5}}'}, "startingOffsets"),
    ({"subscribe": "does-not-exist-topic"}, "do not exist"),
    ({"kafka.bootstrap.servers": "127.0.0.1:1", "brokerTimeoutMs": "2000"},
     "kafka.bootstrap.servers"),
])
def test_bad_input_fails_at_load_with_the_option_and_fix(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path,
    options: dict[str, str | None], message: str,
) -> None:
    base: dict[str, str | None] = {
        "kafka.bootstrap.servers": kafka.bootstrap_servers, "kafka.group.id": group,
        "subscribe": topic, "journalPath": str(tmp_path / "j")}
    base.update(options)
    r = spark.readStream.format("kafka-share")
    for k, v in base.items():
        if v is not None:
            r = r.option(k, v)
    started = time.monotonic()
    with pytest.raises(Exception, match=message.replace("(", r"\(")):
        r.load()
    # Only a guard against a hang, not a promise of speed (that is the next test's 5 s):
    # generous enough for a loaded 2-core machine.
    assert time.monotonic() - started < 120
    assert not spark.streams.active


@pytest.mark.spark_subset
@pytest.mark.parametrize(("address", "cause"), [("127.0.0.1:1", "connection refused"),
                                              ("no-such-host.invalid:9092", "unknown host")])
def test_an_unreachable_broker_fails_load_within_5_s(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path,
    address: str, cause: str,
) -> None:
    """What the client knows at once fails load() in seconds on every Spark line, at the
    default brokerTimeoutMs (30 s), naming the option; only a silent network waits that."""
    share_stream(spark, kafka, [topic], group, tmp_path / "warm")  # Spark's Python worker is up
    r = (spark.readStream.format("kafka-share").option("kafka.bootstrap.servers", address)
         .option("kafka.group.id", group).option("subscribe", topic)
         .option("journalPath", str(tmp_path / "j")))
    text = fails_within(r.load, Exception, "kafka.bootstrap.servers", seconds=5)
    assert cause in text.lower(), text
    assert not spark.streams.active


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("where", ["under-a-file", "under-proc", "read-only"])
def test_an_unusable_journal_path_fails_at_load_before_the_query_starts(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path, where: str,
) -> None:
    # Found by the probe in load(), not as a JournalError (or a bare FileNotFoundError) once
    # the query ran (issue 13).
    if where == "under-proc" and not os.path.isdir("/proc/self"):
        pytest.skip("needs Linux's /proc")
    (tmp_path / "plain").write_text("a file")
    with contextlib.ExitStack() as stack:
        if where == "under-a-file":
            path, cause = tmp_path / "plain" / "journal", f"{tmp_path / 'plain'} is a file, " \
                "not a directory"
        elif where == "under-proc":
            path = Path(f"/proc/kafka-share-{os.getpid()}/journal")
            cause = f"/proc refuses to create {path.parent}"
        else:
            cause = stack.enter_context(read_only_dir(tmp_path / "ro"))
            path = tmp_path / "ro" / "journal"
        before = _tree(tmp_path)
        started = time.monotonic()
        with pytest.raises(Exception, match=re.escape(f"option 'journalPath' = '{path}'")) as info:
            share_stream(spark, kafka, [topic], group, path)
        # Only a guard against a hang, not a promise of speed: generous enough for a loaded
        # 2-core machine.
        assert time.monotonic() - started < 120
        assert cause in str(info.value), str(info.value)
        assert "Set journalPath to a directory that the driver and every executor" in \
            str(info.value), "the error must say what to do"
        assert not spark.streams.active
        assert _tree(tmp_path) == before, "the probe left something behind"
        assert not os.path.lexists(path)


def test_a_new_query_refuses_a_journal_another_query_used(
    spark: SparkSession, kafka: LocalKafka, topic: str, group: str, tmp_path: Path
) -> None:
    produce_spread(kafka, topic, 1, 10)
    journal = tmp_path / "journal"
    run_available_now(share_stream(spark, kafka, [topic], group, journal), tmp_path / "o1",
                      tmp_path / "c1")
    kafka.produce(topic, [b"more"])  # so that the second query runs a task
    q = (share_stream(spark, kafka, [topic], group, journal).writeStream.format("noop")
         .option("checkpointLocation", str(tmp_path / "c2")).start())
    with pytest.raises(Exception, match="belongs to streaming query"):
        q.awaitTermination(90)


@pytest.mark.parametrize(("starting", "expect_old"), [("earliest", True), ("latest", False)])
def test_starting_offsets_sets_the_new_groups_reset_policy(
    spark: SparkSession, kafka: LocalKafka, topic: str, tmp_path: Path, starting: str,
    expect_old: bool,
) -> None:
    group = f"g-starting-{starting}-{tmp_path.name}"  # no config yet: broker default 'latest'
    old = produce_spread(kafka, topic, 1, 50)
    df = share_stream(spark, kafka, [topic], group, tmp_path / "journal",
                      startingOffsets=starting.upper())
    run_available_now(df, tmp_path / "out", tmp_path / "chk")
    out = tmp_path / "out"
    got = set(sink_keys(spark, out)) if list(out.glob("*.parquet")) else set()
    assert got == (old if expect_old else set())
    from confluent_kafka.admin import ConfigResource, ResourceType

    admin = kafka.admin()
    configs = admin.describe_configs([ConfigResource(ResourceType.GROUP, group)])
    entry = next(iter(configs.values())).result(timeout=30)["share.auto.offset.reset"]
    assert entry.value == starting
