"""The source and the queue workers end to end against a secured broker (issue 24).

One broker for the module, with a ``SASL_SSL`` listener (SCRAM-SHA-512 here) and an ``SSL``
listener that requires client certificates, ``StandardAuthorizer`` on and nothing allowed
until granted. Each test's user gets only the ACLs that docs/security.md lists for the
feature ("The ACLs each feature needs"), so a test that passes also checks that table.

- the source exactly once over SASL_SSL SCRAM-SHA-512 and over mutual TLS (with an
  encrypted client key), with the lag in the progress reports and no trailing empty batch
  under ``Trigger.AvailableNow`` (both missing while the share-group protocol client spoke
  PLAINTEXT only: issue 24), and the same checks on the broker's internal PLAINTEXT listener
  as a baseline;
- no empty micro-batch while the topic is idle (processing time), over SASL_SSL and mutual
  TLS, and dedup entries dropped once the group's share-partition start offsets pass them
  (not by ``dedupRetentionMs``) over SASL_SSL: both need the group's offsets, which the
  share-group protocol client could not read on these listeners before issue 24's wiring;
- a task attempt that fails for real (the source's ``_faultInjection``) under SASL_SSL;
- the workers with an output topic and a dead-letter topic over SASL_SSL;
- a topic READ taken away between two runs: an authorization error that names the topic and
  the operation (never "does not exist"), then the grant and a resume from the same checkpoint
  with nothing lost or duplicated; a topic with no ACL at all likewise;
- no password or key password in Python logging, this process's output or Spark's driver log.

Record counts are small: the file should take a few minutes on two cores.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from pyspark import cloudpickle

from pyspark_kafka_share.errors import KafkaShareError
from pyspark_kafka_share.harness import LocalKafka, ProducerRecord
from pyspark_kafka_share.workers import Record, Result, run_workers, start_workers
from pyspark_kafka_share.workers.config import ShareClient, WorkerConfig
from tests.helpers import (
    DRIVER_LOG_SENTINEL,
    assert_exactly_once,
    driver_log,
    known_lag,
    sink_keys,
    stop_when_drained,
    wait_for,
)

pytestmark = [pytest.mark.broker, pytest.mark.spark]

# The worker function runs in Spark's Python workers, which cannot import this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

Key = tuple[str, int, int]

ALICE, ALICE_PW = "alice", "alice-pw-Hq4"
# Distinctive values, looked for in every log line (test_no_secret_in_any_log_line).
CAROL, CAROL_PW = "carol", "CAROLPW-t8Vn2marker"
KEY_PW = "KEYPW-w3Rs6marker"
SECRETS = (CAROL_PW, KEY_PW)

# Long enough that no lock expires while a retried task attempt's new consumer joins (see
# test_source.py::test_a_failed_task_attempt_is_retried_exactly_once).
LOCK_MS = 10_000


@pytest.fixture(scope="module")
def secured() -> Iterator[LocalKafka]:
    """One broker for the module: SASL_SSL (the first listener) and mutual TLS."""
    broker = LocalKafka(security="sasl_ssl,ssl", users={ALICE: ALICE_PW}, heap="512m")
    with broker:
        broker.add_user(CAROL, CAROL_PW)
        yield broker


# -- helpers ---------------------------------------------------------------------------------


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _topic(kafka: LocalKafka, partitions: int = 2) -> str:
    return kafka.create_topic(_name("sec-t"), partitions)


def _group(kafka: LocalKafka, *, earliest: bool = True) -> str:
    group = _name("sec-g")
    if earliest:  # set by the harness's super user; else the source's startingOffsets does
        kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
        kafka.set_group_config(group, "share.record.lock.duration.ms", LOCK_MS)
    return group


def _grant_source(kafka: LocalKafka, user: str, topic: str, group: str, *,
                  starting_offsets: bool = False, topic_read: bool = True) -> None:
    """The source's ACLs as docs/security.md lists them."""
    if topic_read:
        kafka.grant(user, "TOPIC", topic, "READ")
    kafka.grant(user, "TOPIC", topic, "DESCRIBE")
    for operation in ("READ", "DESCRIBE", "DESCRIBE_CONFIGS"):
        kafka.grant(user, "GROUP", group, operation)
    if starting_offsets:
        kafka.grant(user, "GROUP", group, "ALTER_CONFIGS")


def _revoke(kafka: LocalKafka, user: str, resource_type: str, name: str, operation: str, *,
            pattern: str = "LITERAL") -> None:
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    admin = kafka.admin()  # kept alive until its futures are done
    match = AclBindingFilter(ResourceType[resource_type], name, ResourcePatternType[pattern],
                             f"User:{user}", "*", AclOperation[operation],
                             AclPermissionType.ALLOW)
    for fut in admin.delete_acls([match]).values():
        assert fut.result(timeout=30), f"no ACL {operation} on {resource_type} {name} to revoke"


def _settle_acls(kafka: LocalKafka) -> None:
    """Wait until the broker's authorizer applied every ACL change made so far.

    ACL changes reach it through the metadata log, asynchronously but in log order: a
    barrier binding created after them shows in the broker's ACL describe (served from that
    authorizer) only once every earlier change is applied there too. The barrier (DESCRIBE
    on a topic of its own, for a user of its own: it grants nothing a test uses) is removed
    after. 60 s only bounds a broker that never applies it."""
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    barrier = _name("acl-barrier")
    kafka.grant(barrier, "TOPIC", barrier, "DESCRIBE")
    admin = kafka.admin()  # kept alive until its futures are done
    match = AclBindingFilter(ResourceType.TOPIC, barrier, ResourcePatternType.LITERAL,
                             f"User:{barrier}", "*", AclOperation.DESCRIBE,
                             AclPermissionType.ALLOW)

    def shown() -> int:
        return len(admin.describe_acls(match).result(timeout=30))

    wait_for(shown, lambda n: n == 1, 60, "the ACL barrier in the broker's authorizer")
    _revoke(kafka, barrier, "TOPIC", barrier, "DESCRIBE")


def _kafka_options(kafka: LocalKafka, user: str, listener: str, **extra: str) -> dict[str, str]:
    """The source's ``kafka.*`` options to connect as ``user`` (the harness's librdkafka
    settings with the prefix)."""
    mechanism = "SCRAM-SHA-512" if listener == "sasl_ssl" else None
    conf = kafka.client_config(user, mechanism=mechanism, listener=listener)
    return {f"kafka.{k}": str(v) for k, v in {**conf, **extra}.items()}


def _reader(spark: Any, security: dict[str, str], topic: str, group: str, journal: Path,
            **options: str) -> Any:
    r = (spark.readStream.format("kafka-share").option("kafka.group.id", group)
         .option("subscribe", topic).option("journalPath", str(journal))
         .option("numPartitions", "2").option("pollTimeoutMs", "1500"))
    for key, value in {**security, **options}.items():
        r = r.option(key, value)
    return r.load()


def _start(df: Any, out: Path, chk: Path) -> Any:
    return (df.writeStream.format("parquet").option("path", str(out))
            .option("checkpointLocation", str(chk)).trigger(availableNow=True).start())


def _run_available_now(df: Any, out: Path, chk: Path, timeout_s: float = 180) -> Any:
    q = _start(df, out, chk)
    q.awaitTermination(timeout_s)
    assert not q.isActive, "the AvailableNow query did not finish"
    assert q.exception() is None, f"query failed: {q.exception()}"
    return q


def _produce(kafka: LocalKafka, topic: str, n: int, start: int = 0,
             partitions: int = 2) -> set[Key]:
    """``n`` records spread over ``partitions``; their keys, given that the first ``start``
    records were produced the same way before."""
    kafka.produce(topic, (ProducerRecord(value=b"v%d" % i, partition=i % partitions)
                          for i in range(start, start + n)))
    before = Counter(i % partitions for i in range(start))
    after = Counter(i % partitions for i in range(start + n))
    return {(topic, p, o) for p in after for o in range(before[p], after[p])}




def _reports(q: Any) -> list[dict[str, Any]]:
    """The source's report (``latestOffset``: lag, lagByPartition, lastBatch) per progress."""
    return [dict(json.loads(p.sources[0].latestOffset or "{}")) for p in q.recentProgress]


def _group_lags(kafka: LocalKafka, user: str, listener: str,
                group: str) -> dict[tuple[str, int], int | None]:
    """Each partition's lag as the group's DescribeShareGroupOffsets gives it to ``user`` on
    ``listener`` (the package's protocol client: what the source reads the lag with)."""
    from pyspark_kafka_share._kafka.protocol.client import KafkaProtocolClient, iter_partitions

    mechanism = "SCRAM-SHA-512" if listener == "sasl_ssl" else None
    connection = None if listener == "plaintext" else \
        kafka.connection_config(user, mechanism=mechanism, listener=listener)
    client = KafkaProtocolClient(kafka.secured.bootstrap(listener), connection=connection,
                                 timeout_s=30)
    with client:
        return {(t, p.partition): p.lag
                for t, p in iter_partitions(client.describe_share_group_offsets(group))}


def _total_lag(kafka: LocalKafka, user: str, listener: str, group: str) -> int | None:
    """The group's total lag read as :func:`_group_lags` reads it, counted as
    ``tests.helpers.known_lag`` counts it (``None`` while unknown, or the read failed): what
    ``tests.helpers.stop_when_drained`` takes on a listener where ``group_lag`` (no
    credentials) reads nothing."""
    try:
        return known_lag(kafka, _group_lags(kafka, user, listener, group))
    except (KafkaShareError, KafkaException, OSError):
        return None


def _group_start_offsets(kafka: LocalKafka, user: str, listener: str,
                         group: str) -> dict[tuple[str, int], int | None]:
    """Each partition's share-partition start offset, read as :func:`_group_lags` reads the
    lag."""
    from pyspark_kafka_share._kafka.protocol.client import KafkaProtocolClient, iter_partitions

    mechanism = "SCRAM-SHA-512" if listener == "sasl_ssl" else None
    client = KafkaProtocolClient(kafka.secured.bootstrap(listener), timeout_s=30,
                                 connection=kafka.connection_config(user, mechanism=mechanism,
                                                                    listener=listener))
    with client:
        return {(t, p.partition): p.start_offset
                for t, p in iter_partitions(client.describe_share_group_offsets(group))}


def _assert_lag_and_no_trailing_empty_batch(q: Any, produced: int,
                                            lags_after: list[int | None]) -> None:
    """Parity with PLAINTEXT (issue 24): the progress reports the backlog the query started
    with (``produced`` records) and the group's lag reads 0 once they are read, and
    AvailableNow stops at the drain instead of after one more (empty, ~8 s) batch. Every
    problem is reported. (Under AvailableNow a report shows the lag planned for its batch, so
    the last one is not 0: the lag after the run is read from the group.)"""
    rows = [p.numInputRows for p in q.recentProgress]
    lags = [r.get("lag") for r in _reports(q)]
    problems = []
    if not lags or lags[0] is None:
        problems.append(f"no lag in the progress reports: {lags}")
    elif lags[0] != produced:
        problems.append(f"the first report's lag {lags[0]} is not the {produced} records "
                        f"produced: {lags}")
    if not lags_after or any(lag != 0 for lag in lags_after):
        problems.append(f"the group's lag after the run is not 0: {lags_after}")
    if not rows or rows[-1] == 0:
        problems.append(f"a trailing empty batch: rows per batch {rows}")
    assert not problems, "; ".join(problems)


def _read_topic(kafka: LocalKafka, topic: str, expect: int, timeout_s: float = 30) -> list[Any]:
    """Every record of ``topic``, read as the harness's super user over SASL_SSL."""
    from confluent_kafka import Consumer

    c = Consumer({**kafka.client_config(), "group.id": _name("reader"),
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < expect and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                out.append(m)
        end = time.monotonic() + 1.5  # anything beyond ``expect`` would be a duplicate
        while time.monotonic() < end:
            m = c.poll(0.3)
            if m is not None and m.error() is None:
                out.append(m)
    finally:
        c.close()
    return out






# -- the source, exactly once ----------------------------------------------------------------


@pytest.mark.parametrize("listener", ["plaintext", "sasl_ssl", "ssl"],
                         ids=["plaintext-baseline", "sasl_ssl-scram512", "mtls"])
def test_source_exactly_once_with_lag_and_no_trailing_empty_batch(
    spark: Any, secured: LocalKafka, tmp_path: Path, listener: str
) -> None:
    """``plaintext-baseline``: the same broker's internal PLAINTEXT listener (no
    authentication, no ACLs: the harness's shortcut), where the checks hold today; they must
    hold on the secured listeners too."""
    topic = _topic(secured)
    if listener == "plaintext":
        group = _group(secured)
        security = {"kafka.bootstrap.servers": secured.secured.bootstrap("plaintext")}
        options: dict[str, str] = {}
    elif listener == "sasl_ssl":
        # the group's reset policy comes from startingOffsets: group ALTER_CONFIGS needed
        group = _group(secured, earliest=False)
        _grant_source(secured, ALICE, topic, group, starting_offsets=True)
        security = _kafka_options(secured, ALICE, listener)
        options = {"startingOffsets": "earliest"}
    else:
        group = _group(secured)
        _grant_source(secured, ALICE, topic, group)
        cert, key = secured.secured.client_cert(ALICE, key_password="alice-key-Pw5")
        security = _kafka_options(secured, ALICE, listener, **{
            "ssl.certificate.location": str(cert), "ssl.key.location": str(key),
            "ssl.key.password": "alice-key-Pw5"})
        options = {}
    _settle_acls(secured)
    expected = _produce(secured, topic, 1000)
    df = _reader(spark, security, topic, group, tmp_path / "journal", **options)
    q = _run_available_now(df, tmp_path / "out", tmp_path / "chk")
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)
    lags_after = list(_group_lags(secured, ALICE, listener, group).values())
    _assert_lag_and_no_trailing_empty_batch(q, len(expected), lags_after)


@pytest.mark.parametrize("listener", ["sasl_ssl", "ssl"], ids=["sasl_ssl-scram512", "mtls"])
def test_a_failed_task_attempt_on_a_secured_listener_is_retried_exactly_once(
    spark: Any, secured: LocalKafka, tmp_path: Path, listener: str
) -> None:
    """Attempt 0 of task 0 of the first batch fails after it journaled and yielded rows
    (``fail-before-end``); Spark retries it and the retry replays the journal."""
    topic, group = _topic(secured), _group(secured)
    _grant_source(secured, ALICE, topic, group)
    _settle_acls(secured)
    expected = _produce(secured, topic, 1000)
    df = _reader(spark, _kafka_options(secured, ALICE, listener), topic, group,
                 tmp_path / "journal", _faultInjection="fail-before-end:seq=1:part=0:attempt=0")
    with driver_log(spark) as read_log:
        _run_available_now(df, tmp_path / "out", tmp_path / "chk")
        failures = read_log().count("injected failure: fail-before-end")
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)
    assert failures >= 1, "no task attempt failed: the fault was not injected"


def _secured_source(kafka: LocalKafka, listener: str, topic: str) -> tuple[str, dict[str, str]]:
    """A group (earliest, the test lock) and ``alice``'s source options on ``listener``
    (``sasl_ssl`` or ``ssl``: mutual TLS), with the source's ACLs granted and settled."""
    group = _group(kafka)
    _grant_source(kafka, ALICE, topic, group)
    _settle_acls(kafka)
    return group, _kafka_options(kafka, ALICE, listener)  # mutual TLS: alice's certificate


@pytest.mark.parametrize("listener", ["sasl_ssl", "ssl"], ids=["sasl_ssl-scram512", "mtls"])
def test_no_empty_micro_batches_while_the_topic_is_idle(
    spark: Any, secured: LocalKafka, tmp_path: Path, listener: str
) -> None:
    """test_backlog.py::test_no_empty_micro_batches_while_the_queue_is_empty on the secured
    listeners: a processing-time query plans no batch while the group's lag is 0 (before the
    wiring its lag read failed there, the backlog was unknown, and every trigger ran an empty
    batch: issue 24 measured ~8.5 s each)."""
    topic = _topic(secured)
    group, security = _secured_source(secured, listener, topic)
    secured.produce(topic, [b"first"])
    df = _reader(spark, security, topic, group, tmp_path / "journal")
    q = (df.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "chk"))
         .start())
    try:
        def rows() -> int:
            return sum(p.numInputRows for p in q.recentProgress)

        def empty_batches() -> set[int]:
            """Batches that ran (an idle trigger's progress has no addBatch) and read
            nothing."""
            return {p.batchId for p in q.recentProgress
                    if p.numInputRows == 0 and "addBatch" in p.durationMs}

        # The record read and the source's lag known to be 0 (its last report says so), not a
        # fixed pause: until then an empty batch asking for the lag is the source's right.
        wait_for(lambda: (rows(), [r.get("lag") for r in _reports(q)]),
                 lambda got: got[0] >= 1 and bool(got[1]) and got[1][-1] == 0, 120,
                 "the first record read and the source's lag at 0")
        idle_from, empty_before = max(p.batchId for p in q.recentProgress), empty_batches()
        # The test's point is that time passes with nothing to read: the window is a sleep
        # (on a loaded machine fewer triggers fit in it, which can hide a fault but not fail
        # a correct source).
        time.sleep(8)
        idle_to, empty_during = max(p.batchId for p in q.recentProgress), \
            empty_batches() - empty_before
        # An empty batch took ~8.5 s (issue 24): the batch ids alone could miss one.
        took = {p.batchId: p.durationMs.get("triggerExecution") for p in q.recentProgress}
        lags = [r.get("lag") for r in _reports(q)]
        assert idle_to - idle_from <= 1 and not empty_during, \
            f"batches {idle_from}..{idle_to} ran while the topic was idle, empty ones " \
            f"{sorted(empty_during)} (ms per batch {took}, lags {lags})"
        secured.produce(topic, [b"second"])
        wait_for(rows, lambda n: n >= 2, 60, "the second record read")
        assert rows() == 2, "a record was read twice"
    finally:
        q.stop()
    assert q.exception() is None, f"query failed: {q.exception()}"


@pytest.mark.parametrize("listener", ["sasl_ssl", "ssl"], ids=["sasl_ssl-scram512", "mtls"])
def test_dedup_entries_go_once_the_start_offsets_pass_them(
    spark: Any, secured: LocalKafka, tmp_path: Path, listener: str
) -> None:
    """Exact dedup expiry (tests/unit/test_journal.py::
    test_dedup_entries_go_once_the_share_partition_start_offset_passes_them) end to end: a
    batch's commit reads the group's share-partition start offsets over SASL_SSL and drops
    the dedup entries below them, with ``dedupRetentionMs`` a day (before the wiring the read
    failed there and entries stayed until that time limit).

    Two entries are put into the journal through its API while the query runs (a real one
    needs an acknowledgement lost after the journal write): one with records its first
    batch read and acknowledged (below the start offsets), one with offsets no one produced
    (above them). Spark commits a batch to the source when it plans the next one, so the
    query is then fed a few records at a time: its batches' commits must drop the first
    entry and keep the second. The commit cleans the index in its sweep, at most every half
    ``journalRetentionMs``: 1 s here, so that every commit of the test sweeps."""
    from pyspark_kafka_share.source.journal.journal import Journal
    from pyspark_kafka_share.source.journal.keys import SlotKeys

    topic = _topic(secured)
    group, security = _secured_source(secured, listener, topic)
    journal_dir = tmp_path / "journal"
    first = _produce(secured, topic, 100)
    df = _reader(spark, security, topic, group, journal_dir,
                 dedupRetentionMs=str(24 * 3600 * 1000), journalRetentionMs="2000")
    q = (df.writeStream.format("parquet").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", str(tmp_path / "chk")).start())
    j = Journal(str(journal_dir))
    passed = {k for k in first if k[2] < 10}  # read and acknowledged in the first batch
    ahead = {(topic, 0, 1_000_000), (topic, 1, 1_000_000)}  # never produced
    names = {"passed": 999998, "ahead": 999999}  # the slot numbers the entries name

    def left() -> list[int]:
        return sorted({entry.slot for entry in j.dedup_entries()})

    produced = 100
    try:
        wait_for(lambda: sum(p.numInputRows for p in q.recentProgress), lambda n: n >= 100,
                 90, "the first 100 records read")
        for name, keys in (("passed", passed), ("ahead", ahead)):
            j.add_dedup(1, 0, names[name], SlotKeys.of(keys))
        assert j.find_journaled(passed | ahead) == passed | ahead
        committed = j.committed_seq()
        # Two records every 2 s: each batch's commit reads the start offsets, which the
        # broker persists lazily (seen reading 0 after every record was acknowledged); the
        # entry must go within a few batches.
        deadline = time.monotonic() + 60
        while names["passed"] in left() and time.monotonic() < deadline:
            assert q.exception() is None, f"query failed: {q.exception()}"
            _produce(secured, topic, 2, start=produced)
            produced += 2
            time.sleep(2)
    finally:
        q.stop()
    assert q.exception() is None, f"query failed: {q.exception()}"
    assert j.committed_seq() > committed, "no batch was committed to the source"
    assert left() == [names["ahead"]], \
        f"dedup entries after {j.committed_seq()} committed batches: {left()} (expected " \
        "only the one above the group's start offsets, now " \
        f"{_group_start_offsets(secured, ALICE, 'sasl_ssl', group)})"
    assert j.find_journaled(passed | ahead) == ahead
    got = sink_keys(spark, tmp_path / "out")
    assert len(got) == len(set(got)) and first <= set(got), "a record lost or read twice"


# -- the workers -----------------------------------------------------------------------------


def _triage(record: Record) -> Result:
    value = (record.value or b"").decode()
    if value.startswith("poison"):
        return Result.reject("unparseable")
    return Result.accept(f"{value}:done")


@pytest.mark.parametrize(("listener", "typed", "client"),
                         [("sasl_ssl", False, "librdkafka"), ("ssl", False, "librdkafka"),
                          ("ssl", True, "librdkafka"), ("sasl_ssl", False, "native")],
                         ids=["sasl_ssl-scram512", "mtls", "mtls-connection",
                              "sasl_ssl-scram512-native"])
def test_workers_on_a_secured_listener_with_output_and_dead_letter_topics(
    spark: Any, secured: LocalKafka, listener: str, typed: bool, client: ShareClient,
) -> None:
    """``typed``: the settings as ``connection=ConnectionConfig``, not ``consumer_config``;
    ``client``: the workers' share consumer (the native one speaks SASL_SSL and mTLS itself:
    ``test_native_consumer.py``; here end to end, with outputs and dead letters)."""
    src, out, dlq = _topic(secured), _topic(secured, 1), _topic(secured, 1)
    group = _group(secured)
    mechanism = "SCRAM-SHA-512" if listener == "sasl_ssl" else None
    kafka_conf = secured.client_config(ALICE, mechanism=mechanism, listener=listener)
    bootstrap = kafka_conf.pop("bootstrap.servers")
    how: dict[str, Any] = {"consumer_config": kafka_conf}
    if typed:
        how = {"connection": secured.connection_config(ALICE, mechanism=mechanism,
                                                       listener=listener)}
    secured.grant(ALICE, "TOPIC", src, "READ")
    for operation in ("READ", "DESCRIBE", "DESCRIBE_CONFIGS"):
        secured.grant(ALICE, "GROUP", group, operation)
    for topic in (out, dlq):
        secured.grant(ALICE, "TOPIC", topic, "WRITE")
    _settle_acls(secured)
    secured.produce(src, [f"{kind}-{i}".encode() for i in range(10) for kind in ("ok", "poison")])
    job = start_workers(spark, _triage, topics=src, group=group, bootstrap_servers=bootstrap,
                        workers=2, output_topic=out, dead_letter_topic=dlq, on_progress=False,
                        client=client, **how)
    # Stopped once every record is acknowledged (a 5 s idle timeout could end the job with
    # records left on a loaded machine), the lag read as alice on this listener.
    summary = stop_when_drained(job, secured, group,
                                lag=lambda: _total_lag(secured, ALICE, listener, group))
    t = summary.totals
    assert (t["accepted"], t["rejected"], t["dead_lettered"], t["outputs"]) == \
        (10, 10, 10, 10), str(summary)
    outputs = Counter((m.value() or b"").decode() for m in _read_topic(secured, out, 10))
    assert outputs == Counter(f"ok-{i}:done" for i in range(10))
    dead = Counter((m.value() or b"").decode() for m in _read_topic(secured, dlq, 10))
    assert dead == Counter(f"poison-{i}" for i in range(10))


def test_workers_control_topic_with_exactly_the_listed_acls(
    spark: Any, secured: LocalKafka,
) -> None:
    """The workers' control topic (what a Spark Connect client uses; here a classic session
    with ``control_topic``) over SASL_SSL with the ACLs docs/security.md lists: without CREATE
    on a missing control topic the job fails before any task, naming the topic and the
    operation; with CREATE, WRITE and READ on it the driver stops the workers through it."""
    from pyspark_kafka_share.errors import AuthorizationError

    src, group, control = _topic(secured), _group(secured), _name("sec-ctl")
    kafka_conf = secured.client_config(ALICE, mechanism="SCRAM-SHA-512", listener="sasl_ssl")
    bootstrap = kafka_conf.pop("bootstrap.servers")
    secured.grant(ALICE, "TOPIC", src, "READ")
    for operation in ("READ", "DESCRIBE", "DESCRIBE_CONFIGS"):
        secured.grant(ALICE, "GROUP", group, operation)
    for operation in ("WRITE", "READ"):
        secured.grant(ALICE, "TOPIC", control, operation)
    _settle_acls(secured)
    secured.produce(src, [f"ok-{i}".encode() for i in range(10)])
    common: dict[str, Any] = {"topics": src, "group": group, "bootstrap_servers": bootstrap,
                              "consumer_config": kafka_conf, "workers": 2,
                              "control_topic": control, "on_progress": False}
    with pytest.raises(AuthorizationError, match=rf"(?s)Create.*topic '{control}'"):
        run_workers(spark, lambda r: None, **common)
    secured.grant(ALICE, "TOPIC", control, "CREATE")
    _settle_acls(secured)
    # Stopped by the driver once every record is acknowledged (the lag read as alice), not on
    # a 5 s idle timeout that could end the job with records left on a loaded machine.
    summary = stop_when_drained(start_workers(spark, lambda r: None, **common), secured, group,
                                lag=lambda: _total_lag(secured, ALICE, "sasl_ssl", group))
    assert summary.totals["accepted"] == 10, str(summary)
    # The driver's stop reached every worker through the topic (a worker that could not read
    # it would not stop: no idle timeout here; the job would be cancelled after the stop's
    # grace, its worker shown lost, or it would report "lost the driver").
    assert {w.get("stop_reason") for w in summary.workers} == {"stopped by driver"}, \
        str(summary)


def _grant_eos(kafka: LocalKafka, user: str, src: str, outs: tuple[str, ...],
               group: str) -> list[tuple[str, str, str, str]]:
    """The ACLs docs/security.md lists for the workers with ``exactly_once_outputs=True``, but
    the marker topic's CREATE: (resource type, name, operation, pattern) of each granted."""
    from pyspark_kafka_share.workers.exactly_once import marker_topic

    grants = [("TOPIC", src, "READ", "LITERAL"),
              *(("GROUP", group, op, "LITERAL") for op in ("READ", "DESCRIBE", "DESCRIBE_CONFIGS")),
              *(("TOPIC", t, "WRITE", "LITERAL") for t in outs),
              *(("TRANSACTIONAL_ID", f"kafka-share-workers.{group}.", op, "PREFIXED")
                for op in ("WRITE", "DESCRIBE")),
              *(("TOPIC", marker_topic(group), op, "LITERAL")
                for op in ("READ", "WRITE", "DESCRIBE_CONFIGS"))]
    for rtype, name, op, pattern in grants:
        kafka.grant(user, rtype, name, op, pattern=pattern)
    return grants


def _denial_problems(exc: BaseException, name: str, operation: str) -> list[str]:
    """What an exactly-once ACL error lacks: authorization, the resource, the operation and
    the grant; never "does not exist"."""
    text = str(exc)
    problems = []
    if "does not exist" in text or "do not exist" in text:
        problems.append("it calls something missing")
    if not re.search(r"not allowed to .*" + re.escape(operation), text):
        problems.append(f"it does not name the operation {operation}")
    if name not in text:
        problems.append(f"it does not name {name!r}")
    if "kafka-acls.sh" not in text:
        problems.append("it gives no grant")
    return [f"{p}: {text}" for p in problems]


def test_workers_exactly_once_outputs_with_exactly_the_listed_acls(
    spark: Any, secured: LocalKafka,
) -> None:
    """``exactly_once_outputs=True`` over SASL_SSL with exactly the ACLs docs/security.md lists
    for it (no CLUSTER IDEMPOTENT_WRITE): a run ends with every record's output or dead letter
    once for a read_committed reader. Before it, without CREATE on the missing marker topic,
    and after it, without each of the other grants, ``run_workers`` fails before any task
    with an authorization error naming what is missing. The marker topic's CREATE (once it
    exists) and the transactional ids' DESCRIBE (implied by WRITE) are not needed."""
    from pyspark_kafka_share.errors import AuthorizationError
    from pyspark_kafka_share.workers.eos_access import check_exactly_once_access
    from pyspark_kafka_share.workers.exactly_once import marker_topic

    src, out, dlq, group = _topic(secured), _topic(secured, 1), _topic(secured, 1), \
        _group(secured)
    markers = marker_topic(group)
    kafka_conf = secured.client_config(ALICE, mechanism="SCRAM-SHA-512", listener="sasl_ssl")
    bootstrap = kafka_conf.pop("bootstrap.servers")
    grants = _grant_eos(secured, ALICE, src, (out, dlq), group)
    _settle_acls(secured)
    secured.produce(src, [f"{kind}-{i}".encode() for i in range(10) for kind in ("ok", "poison")])
    common: dict[str, Any] = {"topics": src, "group": group, "bootstrap_servers": bootstrap,
                              "consumer_config": kafka_conf, "workers": 2, "output_topic": out,
                              "dead_letter_topic": dlq, "exactly_once_outputs": True,
                              "on_progress": False}
    problems: list[str] = []

    def denied(name: str, operation: str) -> None:
        started = time.monotonic()
        with pytest.raises(AuthorizationError) as caught:
            run_workers(spark, _triage, idle_timeout_s=5, **common)
        problems.extend(_denial_problems(caught.value, name, operation))
        if time.monotonic() - started > 30:
            problems.append(f"{operation} on {name}: took {time.monotonic() - started:.0f}s")
        assert spark.sparkContext.statusTracker().getActiveJobsIds() == []

    denied(markers, "Create")
    secured.grant(ALICE, "TOPIC", markers, "CREATE")
    _settle_acls(secured)
    # Stops once all 20 are processed (a short idle timeout stopped it early on a loaded
    # machine: the first transactional producers wait for the coordinator to load).
    summary = run_workers(spark, _triage, idle_timeout_s=60, max_records=20, **common)
    t = summary.totals
    assert (t["accepted"], t["rejected"], t["dead_lettered"], t["outputs"]) == \
        (10, 10, 10, 10), f"{summary}\n{summary.workers}"
    assert t["transactions"] >= 1, str(summary)
    outputs = Counter((m.value() or b"").decode() for m in _read_topic(secured, out, 10))
    assert outputs == Counter(f"ok-{i}:done" for i in range(10))
    dead = Counter((m.value() or b"").decode() for m in _read_topic(secured, dlq, 10))
    assert dead == Counter(f"poison-{i}" for i in range(10))

    # Each grant taken away in turn (and given back): named in the error.
    prefix = f"kafka-share-workers.{group}."
    for rtype, name, op, label in [("TOPIC", markers, "DESCRIBE_CONFIGS", "DescribeConfigs"),
                                   ("TOPIC", markers, "READ", "Read"),
                                   ("TOPIC", markers, "WRITE", "Write"),
                                   ("TRANSACTIONAL_ID", prefix, "WRITE", "Write")]:
        pattern = "PREFIXED" if rtype == "TRANSACTIONAL_ID" else "LITERAL"
        assert (rtype, name, op, pattern) in grants
        _revoke(secured, ALICE, rtype, name, op, pattern=pattern)
        _settle_acls(secured)
        denied(name, label)
        secured.grant(ALICE, rtype, name, op, pattern=pattern)
        _settle_acls(secured)
    # WRITE on the output topic (with DESCRIBE, so that it is not hidden from the workers).
    secured.grant(ALICE, "TOPIC", out, "DESCRIBE")
    _revoke(secured, ALICE, "TOPIC", out, "WRITE")
    _settle_acls(secured)
    denied(out, "Write")
    secured.grant(ALICE, "TOPIC", out, "WRITE")
    _revoke(secured, ALICE, "TOPIC", out, "DESCRIBE")
    # Not needed: CREATE on a marker topic that exists; the transactional ids' DESCRIBE.
    _revoke(secured, ALICE, "TOPIC", markers, "CREATE")
    _revoke(secured, ALICE, "TRANSACTIONAL_ID", prefix, "DESCRIBE", pattern="PREFIXED")
    _settle_acls(secured)
    settings = WorkerConfig.create(topics=src, group=group, bootstrap_servers=bootstrap,
                                   consumer_config=kafka_conf)
    assert check_exactly_once_access(settings.client, settings.producer_settings()) == markers
    assert not problems, "\n".join(problems)


# -- missing ACLs ------------------------------------------------------------------------------


def _run_expecting_failure(spark: Any, security: dict[str, str], topic: str, group: str,
                           tmp_path: Path, timeout_s: float = 150) -> tuple[str, float]:
    """Start the query (same journal, sink and checkpoint as the other runs); it must fail,
    at ``load()`` or while it runs. Returns the error's text and how long it took."""
    started = time.monotonic()
    try:
        df = _reader(spark, security, topic, group, tmp_path / "journal")
    except Exception as exc:  # noqa: BLE001 - failing at load() is the better outcome
        return f"{exc}\n{exc.__cause__ or ''}", time.monotonic() - started
    q = _start(df, tmp_path / "out", tmp_path / "chk")
    with contextlib.suppress(Exception):  # q.exception() has it
        q.awaitTermination(timeout_s)
    active = q.isActive
    with contextlib.suppress(Exception):
        q.stop()
    assert not active, f"the query neither failed nor finished within {timeout_s}s"
    error = q.exception()
    assert error is not None, "the query succeeded without the ACL"
    text = str(error)
    return text, time.monotonic() - started


def _authorization_problems(text: str, topic: str, operation: str) -> list[str]:
    """What an authorization error's text lacks: it must say authorization, name the topic
    and the operation, and never call the topic missing."""
    tail = text[-1500:]
    problems = []
    if "does not exist" in text or "do not exist" in text:
        problems.append(f"it calls the topic missing: {tail}")
    if not re.search(r"authoriz", text, re.IGNORECASE):
        problems.append(f"it does not say authorization: {tail}")
    if topic not in text:
        problems.append(f"it does not name topic {topic!r}")
    if operation not in text:
        problems.append(f"it does not name the operation {operation}: {tail}")
    return problems


@pytest.mark.parametrize("listener", ["sasl_ssl", "ssl"], ids=["sasl_ssl-scram512", "mtls"])
def test_missing_topic_read_is_an_authorization_error_then_the_query_resumes(
    spark: Any, secured: LocalKafka, tmp_path: Path, listener: str
) -> None:
    topic, group = _topic(secured), _group(secured)
    _grant_source(secured, ALICE, topic, group)
    _settle_acls(secured)
    security = _kafka_options(secured, ALICE, listener)
    first = _produce(secured, topic, 200)
    df = _reader(spark, security, topic, group, tmp_path / "journal")
    _run_available_now(df, tmp_path / "out", tmp_path / "chk")
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), first)

    _revoke(secured, ALICE, "TOPIC", topic, "READ")
    _settle_acls(secured)
    second = _produce(secured, topic, 200, start=200)
    text, took = _run_expecting_failure(spark, security, topic, group, tmp_path)
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), first)  # nothing committed
    problems = _authorization_problems(text, topic, "READ")
    if took > 30:  # Spark's 4 task attempts, each failing the same way, took longer
        problems.append(f"the missing ACL took {took:.0f}s to fail the query")

    # the resume is checked whatever the message said; the message's problems fail the test
    secured.grant(ALICE, "TOPIC", topic, "READ")
    _settle_acls(secured)
    df = _reader(spark, security, topic, group, tmp_path / "journal")
    _run_available_now(df, tmp_path / "out", tmp_path / "chk")
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), first | second)
    assert not problems, "the error without topic READ: " + "; ".join(problems)


def test_a_topic_without_any_acl_is_not_reported_missing(
    spark: Any, secured: LocalKafka, tmp_path: Path
) -> None:
    """No ACL on the topic at all (no DESCRIBE either): the broker hides it from metadata, but
    the error must still be about authorization, not a missing topic."""
    topic, group = _topic(secured), _group(secured)
    _grant_source(secured, ALICE, topic, group, topic_read=False)
    _revoke(secured, ALICE, "TOPIC", topic, "DESCRIBE")
    _settle_acls(secured)
    security = _kafka_options(secured, ALICE, "sasl_ssl")
    expected = _produce(secured, topic, 100)
    text, _ = _run_expecting_failure(spark, security, topic, group, tmp_path)
    assert sink_keys(spark, tmp_path / "out") == []
    problems = _authorization_problems(text, topic, "DESCRIBE")

    _grant_source(secured, ALICE, topic, group)
    _settle_acls(secured)
    df = _reader(spark, security, topic, group, tmp_path / "journal")
    _run_available_now(df, tmp_path / "out", tmp_path / "chk")
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)
    assert not problems, "the error without any topic ACL: " + "; ".join(problems)


# -- secrets ---------------------------------------------------------------------------------

def test_no_secret_in_any_log_line(
    spark: Any, secured: LocalKafka, tmp_path: Path, caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Carol's SASL password and an encrypted client key's password, as the source takes them,
    through a run with a failed task attempt (its traceback reaches the driver log) and a run
    over mutual TLS."""
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="pyspark_kafka_share")
    topic, group = _topic(secured), _group(secured)
    _grant_source(secured, CAROL, topic, group)
    _settle_acls(secured)
    cert, key = secured.secured.client_cert(CAROL, key_password=KEY_PW)
    mtls = _kafka_options(secured, CAROL, "ssl", **{
        "ssl.certificate.location": str(cert), "ssl.key.location": str(key),
        "ssl.key.password": KEY_PW})
    sasl = _kafka_options(secured, CAROL, "sasl_ssl")
    assert sasl["kafka.sasl.password"] == CAROL_PW
    with driver_log(spark) as read_log:
        expected = _produce(secured, topic, 100)
        df = _reader(spark, sasl, topic, group, tmp_path / "journal",
                     _faultInjection="fail-before-end:seq=1:part=0:attempt=0")
        q = _run_available_now(df, tmp_path / "out", tmp_path / "chk")
        progress = [p.json for p in q.recentProgress]
        expected |= _produce(secured, topic, 30, start=100)
        df = _reader(spark, mtls, topic, group, tmp_path / "journal")
        q = _run_available_now(df, tmp_path / "out", tmp_path / "chk")
        progress += [p.json for p in q.recentProgress]
        time.sleep(0.5)  # late log lines
        driver = read_log()
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)
    assert DRIVER_LOG_SENTINEL in driver, "Spark's driver log was not captured"
    assert "injected failure" in driver, "no task failure reached the driver log"
    out, err = capfd.readouterr()
    seen = {
        "Python logging": "\n".join(f"{r.name} {r.levelname} {r.getMessage()}"
                                    for r in caplog.records),
        "Spark driver log": driver, "stdout": out, "stderr": err,
        "progress": "\n".join(progress),
    }
    leaks = [f"{secret} in {where}" for where, text in seen.items() for secret in SECRETS
             if secret in text]
    assert not leaks, "secrets shown: " + "; ".join(leaks)
