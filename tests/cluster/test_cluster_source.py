"""The kafka-share source on a Spark standalone cluster: speculative copies and a killed executor.

Both tests read with ``numPartitions`` 4 into Spark's exactly-once file sink (Parquet files and
a checkpoint) and check that the sink holds every produced record exactly once, with the
journal on each store and content (the ``journal`` fixture: local and ``s3://``, ``offsets``
and ``records`` slots; :func:`assert_content` checks the slots hold what was asked). What
Spark did is read back from the driver's REST API (``/api/v1/applications/<id>/stages``):
which task attempts were speculative, which failed with the executor, and which succeeded.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from pyspark_kafka_share.harness import LocalKafka, LocalSparkCluster
from tests.fixtures.journal import JOURNAL_MATRIX, JournalAt, assert_content
from tests.fixtures.kafka import ShareConsumerFactory, TopicFactory
from tests.helpers import (
    Key,
    OptionValue,
    assert_exactly_once,
    produce_spread,
    run_available_now,
    share_stream,
    sink_keys,
    start_parquet,
)

pytestmark = pytest.mark.cluster


def _cells(*journals: str, librdkafka: str) -> list[Any]:
    """Parameters ``(journal, client)``: each of ``journals`` on the native client (the
    source's default since issue 39 item 5, whose journal slot may hold several polls; its id
    the cell alone), and the ``librdkafka`` cell once more with ``client=librdkafka``, so that
    both clients go through a lost executor and a speculative copy."""
    return [*(pytest.param(j, "native", id=j) for j in journals),
            pytest.param(librdkafka, "librdkafka", id=f"{librdkafka}-librdkafka")]


def _reader(spark: SparkSession, kafka: LocalKafka, topic: str, group: str, journal: JournalAt,
            **options: OptionValue) -> DataFrame:
    return share_stream(spark, kafka, topic, group, journal, **{"numPartitions": 4, **options})


def _produce(kafka: LocalKafka, topic: str, partitions: int, n: int) -> set[Key]:
    return produce_spread(kafka, topic, partitions, n, key=lambda i: b"k%d" % i)


def _stage_ids(cluster: LocalSparkCluster, spark: SparkSession) -> set[tuple[int, int]]:
    return {(s["stageId"], s["attemptId"]) for s in cluster.app_api(spark, "/stages")}


def _tasks(cluster: LocalSparkCluster, spark: SparkSession,
           stages: set[tuple[int, int]]) -> list[dict[str, Any]]:
    """Every task attempt of ``stages``, as the REST API describes it (with ``stageId``)."""
    out = []
    for stage_id, attempt in sorted(stages):
        for t in cluster.app_api(spark, f"/stages/{stage_id}/{attempt}/taskList?length=10000"):
            out.append({**t, "stageId": stage_id})
    return out


def _describe(t: dict[str, Any]) -> str:
    written = (t.get("taskMetrics") or {}).get("outputMetrics", {}).get("recordsWritten")
    error = (t.get("errorMessage") or "").splitlines()[0][:90] if t.get("errorMessage") else ""
    return (f"stage {t['stageId']} task {t['index']} attempt {t['attempt']} (taskId "
            f"{t['taskId']}) on executor {t['executorId']} ({t['host']}): {t['status']}"
            f"{' speculative' if t['speculative'] else ''}, {t.get('duration', 0)} ms, "
            f"rows written {written}{f', {error}' if error else ''}")


def _backlog(cluster: LocalSparkCluster, spark: SparkSession, kafka: LocalKafka,
             topic_factory: TopicFactory, n: int) -> tuple[str, set[Key], set[tuple[int, int]]]:
    """A new topic of 2 partitions holding ``n`` records, their keys, and the stages Spark ran
    before (those of the test's query come after)."""
    topic = topic_factory(2)
    return topic, _produce(kafka, topic, 2, n), _stage_ids(cluster, spark)


# Each store and each content once (the executor-kill test below runs every cell), and
# librdkafka on a local journal.
@pytest.mark.parametrize(("journal", "client"),
                         _cells("local-offsets", "s3-records", librdkafka="local-offsets"),
                         indirect=["journal"])
def test_speculative_copies_run_and_the_sink_stays_exactly_once(
    cluster: LocalSparkCluster, cluster_spark: SparkSession, kafka: LocalKafka,
    topic_factory: TopicFactory, group: str, journal: JournalAt, client: str, tmp_path: Path,
    evidence: Callable[[str], None],
) -> None:
    spark = cluster_spark
    topic, expected, before = _backlog(cluster, spark, kafka, topic_factory, 20_000)
    # Task 0 of the first batch holds its END for 25 s (after journaling and ACCEPTing what it
    # read); the others end in a few seconds, so Spark launches a copy of task 0 on the other
    # executor. The copy (attempt 1, no sleep) finds the log open and ENDs it; the original
    # finds END taken when it wakes (or is killed first) and RELEASEs what it holds.
    df = _reader(spark, kafka, topic, group, journal, client=client,
                 _faultInjection="sleep-before-end:seq=1:part=0:attempt=0:ms=25000")
    run_available_now(df, tmp_path / "out", tmp_path / "chk", 300)
    assert_content(journal)
    # Spark kills the losing attempt once the copy succeeded: wait until it is gone.
    deadline = time.monotonic() + 60
    while True:
        tasks = _tasks(cluster, spark, _stage_ids(cluster, spark) - before)
        if time.monotonic() > deadline or all(t["status"] != "RUNNING" for t in tasks):
            break
        time.sleep(0.5)
    speculative = [t for t in tasks if t["speculative"]]
    for t in tasks:
        if t["speculative"] or t["index"] == 0:
            evidence(_describe(t))
    assert speculative, "Spark launched no speculative attempt: \n" + "\n".join(
        _describe(t) for t in tasks)
    winners = [t for t in speculative if t["status"] == "SUCCESS"]
    assert winners, "no speculative attempt succeeded:\n" + "\n".join(map(_describe, speculative))
    # The copy ran on the other executor, which the scheduler sees as another host.
    for t in winners:
        original = next(o for o in tasks if o["stageId"] == t["stageId"]
                        and o["index"] == t["index"] and not o["speculative"])
        assert original["host"] != t["host"]
        assert original["status"] in ("KILLED", "SUCCESS")
    evidence(f"client={client}: {len(speculative)} speculative attempt(s), {len(winners)} "
             f"succeeded; sink checked for {len(expected)} records")
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)


def _log_state(journal: JournalAt, seq: int, part: int) -> tuple[int, bool]:
    """(data slots, END written) of the journal's log of ``(seq, part)``, read with the
    package's own journal (local directory or object store alike)."""
    from pyspark_kafka_share.errors import JournalError

    try:
        scan = journal.open(fsync=False).part_log(seq, part).scan()
    except (FileNotFoundError, JournalError):  # not there yet, or renamed away by a commit
        return 0, False
    return len(scan.data_slots), scan.end is not None


# Every journal cell on the native client, and librdkafka on a local journal of offsets.
@pytest.mark.parametrize(("journal", "client"),
                         _cells(*JOURNAL_MATRIX, librdkafka="local-offsets"),
                         indirect=["journal"])
def test_an_executor_killed_mid_batch_loses_and_duplicates_nothing(
    cluster: LocalSparkCluster, cluster_spark: SparkSession, kafka: LocalKafka,
    topic_factory: TopicFactory, group: str, journal: JournalAt, client: str, tmp_path: Path,
    evidence: Callable[[str], None],
) -> None:
    spark = cluster_spark
    topic, expected, before = _backlog(cluster, spark, kafka, topic_factory, 30_000)
    executors = {e.executor_id: e for e in cluster.executors()}
    # The first attempts of tasks 0 and 1 of batch 1 hold each poll's records 2 s before
    # journaling them, then hold their END for 15 s. The victim is the executor of the first
    # of them seen with a journaled (and ACCEPTed) slot and no END: its retry must replay the
    # slots and continue the log.
    faults = ";".join(f"sleep-before-publish:seq=1:part={p}:attempt=0:ms=2000;"
                      f"sleep-before-end:seq=1:part={p}:attempt=0:ms=15000" for p in (0, 1))
    df = _reader(spark, kafka, topic, group, journal, client=client, _faultInjection=faults)
    q = start_parquet(df, tmp_path / "out", tmp_path / "chk", available_now=True)
    deadline = time.monotonic() + 120
    slots = 0
    chosen: dict[str, Any] | None = None
    while chosen is None and time.monotonic() < deadline and q.isActive:
        stages = _stage_ids(cluster, spark) - before
        first = {min(stages)} if stages else set()  # batch 1 (Spark's batch 0)
        for t in _tasks(cluster, spark, first):
            if t["status"] != "RUNNING" or t["index"] > 1 or t["executorId"] not in executors:
                continue
            slots, ended = _log_state(journal, 1, t["index"])
            if slots >= 1 and not ended:
                chosen = t
                break
        time.sleep(0.1)
    assert chosen is not None, (
        f"no running task 0 or 1 of batch 1 journaled a slot before its END: nothing to kill "
        f"mid-batch; "
        f"query active: {q.isActive}, error: {q.exception()}; tasks:\n" + "\n".join(
            _describe(t) for t in _tasks(cluster, spark, _stage_ids(cluster, spark) - before)))
    assert_content(journal, [(1, chosen["index"])])
    victim = executors[chosen["executorId"]]
    killed = cluster.kill_executor(victim.worker)
    assert killed.pid == victim.pid
    evidence(f"client={client}: SIGKILLed executor {killed.executor_id} (pid {killed.pid}, worker "
             f"{killed.worker}, {killed.host}) while task {chosen['index']} of batch 1 ran there "
             f"with {slots} slot(s) journaled and ACCEPTed and no END")
    with contextlib.suppress(Exception):  # a failed query raises here; checked below
        q.awaitTermination(300)
    assert not q.isActive, "the AvailableNow query did not finish"
    outcome = "the query recovered by itself (tasks retried)"
    if q.exception() is not None:
        # A query may also fail on the lost executor; it must recover from its checkpoint.
        evidence(f"the query failed: {str(q.exception())[:200]}; restarting it from the "
                 f"checkpoint")
        df2 = _reader(spark, kafka, topic, group, journal, client=client)
        run_available_now(df2, tmp_path / "out", tmp_path / "chk", 300)
        outcome = "the query was restarted from its checkpoint"
    tasks = _tasks(cluster, spark, _stage_ids(cluster, spark) - before)
    lost = [t for t in tasks if t["executorId"] == killed.executor_id
            and t["status"] != "SUCCESS"]
    for t in lost:
        evidence("lost with the executor: " + _describe(t))
    assert lost, "no task attempt failed with the killed executor"
    assert any(t["index"] == chosen["index"] and t["stageId"] == chosen["stageId"]
               for t in lost), f"task {chosen['index']} was not running on the executor"
    assert all("ExecutorLostFailure" in (t.get("errorMessage") or "") or
               t["status"] == "KILLED" for t in lost), "\n".join(map(_describe, lost))
    for t in lost:
        retries = [r for r in tasks if r["stageId"] == t["stageId"] and r["index"] == t["index"]
                   and r["status"] == "SUCCESS"]
        assert retries, f"task {t['index']} of stage {t['stageId']} never succeeded"
        evidence("retried: " + _describe(retries[0]))
    rows = spark.read.parquet(str(tmp_path / "out")).select("deliveryCount").collect()
    redelivered = sum(1 for r in rows if r.deliveryCount > 1)
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)
    evidence(f"{outcome}; the sink holds each of the {len(expected)} records once; "
             f"{redelivered} of them have deliveryCount > 1 (the killed executor held them "
             f"unacknowledged; the broker redelivered them)")
    cluster.wait_for_executors(spark, timeout_s=120)  # the replacement, for the next tests


def test_a_journal_path_the_executors_do_not_share_fails_clearly(
    cluster_spark: SparkSession, kafka: LocalKafka, topic_factory: TopicFactory, group: str,
    tmp_path: Path, share_consumer: ShareConsumerFactory, evidence: Callable[[str], None],
) -> None:
    """A relative ``journalPath`` is a different directory for the driver (its working
    directory) and for each executor (its own work directory), as a node-local path is on a
    multi-node cluster. The tasks must fail on the driver's missing marker, naming the option,
    before they acknowledge anything."""
    import shutil
    import uuid

    from confluent_kafka import AcknowledgeType
    from pyspark.errors import StreamingQueryException

    topic = topic_factory(2)
    _produce(kafka, topic, 2, 100)
    relative = f"node-local-journal-{uuid.uuid4().hex[:8]}"
    df = _reader(cluster_spark, kafka, topic, group, JournalAt("local", relative))
    q = start_parquet(df, tmp_path / "out", tmp_path / "chk")
    try:
        with pytest.raises(StreamingQueryException) as failure:
            q.awaitTermination(240)
    finally:
        q.stop()
        shutil.rmtree(relative, ignore_errors=True)  # the driver's side, in its cwd
    text = str(failure.value)
    assert "option 'journalPath'" in text and "not the same place on this executor host" in text
    evidence(f"relative journalPath {relative!r}: the query failed with: "
             f"{text[text.index('option'):][:160]}")
    # Nothing was acquired or acknowledged: every record comes on its first delivery.
    consumer = share_consumer(group, [topic])
    got: list[int] = []
    deadline = time.monotonic() + 60
    while len(got) < 100 and time.monotonic() < deadline:
        for m in consumer.poll(1.0):
            delivery_count = m.delivery_count()
            assert delivery_count is not None
            got.append(delivery_count)
            consumer.acknowledge(m, AcknowledgeType.ACCEPT)
        consumer.commit_sync(10)
    assert sorted(got) == [1] * 100
