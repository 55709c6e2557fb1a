"""The journal on S3: a real S3 server (moto, LocalS3) that honours ``If-None-Match``.

First the server's conditional create itself, then the journal's slot protocol on ``s3://``,
the checks at ``load()``, and finally the failure tests of ``test_source.py`` and
``test_reader.py`` with the journal on the server: racing attempts of one task, a Python
worker killed after publish and before ACK, a batch failing out of retries then a restart from
the checkpoint, and a query stopped mid-batch and restarted.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pyspark_kafka_share._kafka import pool as _pool
from pyspark_kafka_share._kafka.arrow import arrow_schema
from pyspark_kafka_share.errors import JournalClosed, OptionError
from pyspark_kafka_share.localkafka import LocalKafka, ProducerRecord
from pyspark_kafka_share.localkafka.s3 import LocalS3
from pyspark_kafka_share.source.journal.journal import EndMarker, Journal
from pyspark_kafka_share.source.options import parse_options
from pyspark_kafka_share.source.task import TaskSpec, read_partition

Key = tuple[str, int, int]
# The s3_journal fixture (tests/integration/conftest.py): .url, .options (journal.<key>),
# .store_options (without the prefix).
S3Journal = Any


def _journal(where: S3Journal, **kw: Any) -> Journal:
    return Journal(where.url, options=where.store_options, **kw)


def _batch(topic: str, offsets: list[int]) -> pa.RecordBatch:
    n = len(offsets)
    cols = {"key": [None] * n, "value": [b"v"] * n, "topic": [topic] * n,
            "partition": [0] * n, "offset": offsets, "timestamp": [None] * n,
            "timestampType": [0] * n, "deliveryCount": [1] * n}
    return pa.RecordBatch.from_pydict(cols, schema=arrow_schema(False))


def _end(attempt: int, acked: tuple[int, ...] = ()) -> Callable[[Any], EndMarker]:
    return lambda s: EndMarker(attempt=attempt, data_slots=len(s.data_slots), records=0,
                               acked_slots=acked)


def _keys_under(where: S3Journal, sub: str) -> list[str]:
    j = _journal(where)
    store = j.store
    return sorted(store._keys_under(j._p(sub)))  # type: ignore[attr-defined]


# -- the server --------------------------------------------------------------------------------


def test_the_server_refuses_a_second_exclusive_create_also_under_races(
    s3: LocalS3, s3_journal: S3Journal
) -> None:
    import obstore
    from obstore.exceptions import AlreadyExistsError
    from obstore.store import S3Store

    opts = s3_journal.store_options
    bucket, prefix = s3_journal.url.removeprefix("s3://").split("/", 1)
    store = S3Store(bucket, config={k: v for k, v in opts.items()},
                    client_options={"allow_http": True})
    obstore.put(store, f"{prefix}/once", b"first", mode="create")
    with pytest.raises(AlreadyExistsError):
        obstore.put(store, f"{prefix}/once", b"second", mode="create")
    assert bytes(obstore.get(store, f"{prefix}/once").bytes()) == b"first"
    wins: Counter[int] = Counter()
    lock = threading.Lock()

    def racer(i: int) -> None:
        for k in range(25):
            try:
                obstore.put(store, f"{prefix}/race/{k}", b"%d" % i, mode="create")
            except AlreadyExistsError:
                continue
            with lock:
                wins[k] += 1

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wins == Counter(dict.fromkeys(range(25), 1)), "a key had no or several winners"


# -- the journal's protocol on S3 ----------------------------------------------------------------


def test_slots_are_exclusive_and_nothing_follows_end(s3_journal: S3Journal) -> None:
    j = _journal(s3_journal)
    a, b = j.part_log(1, 0), j.part_log(1, 0)
    a.open()
    b.open()
    assert a.append(_batch("t", [0, 1]), attempt=1) == 0
    assert b.append(_batch("t", [2]), attempt=2) == 1
    final = a.end(_end(1))
    assert final.data_slots == [0, 1] and final.end is not None
    with pytest.raises(JournalClosed):
        b.append(_batch("t", [3]), attempt=2)
    assert b.end(_end(2)).end == final.end, "the first END stands"
    offsets = [o for batch in a.read(final) for o in batch.column("offset").to_pylist()]
    assert offsets == [0, 1, 2]
    assert (a.writer(0), a.writer(1)) == (1, 2)


def test_concurrent_creators_exactly_one_wins_each_slot(s3_journal: S3Journal) -> None:
    j = _journal(s3_journal)
    j.part_log(1, 0).open()
    won: list[int] = []
    lock = threading.Lock()

    def writer(i: int) -> None:
        log = j.part_log(1, 0)
        for k in range(10):
            slot = log.append(_batch("t", [i * 100 + k]), attempt=i)
            with lock:
                won.append(slot)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == list(range(40)), "a slot was won twice or skipped"
    scan = j.part_log(1, 0).scan()
    got = sorted(o for b in j.part_log(1, 0).read(scan) for o in b.column("offset").to_pylist())
    assert got == sorted(i * 100 + k for i in range(4) for k in range(10))


def test_dedup_commit_cleanup_and_owner(s3_journal: S3Journal) -> None:
    j = _journal(s3_journal)
    assert j.in_use() is None
    j.claim("query-a")
    j.claim("query-a")
    other = _journal(s3_journal)
    from pyspark_kafka_share.source.journal import journal as journal_module

    journal_module._CLAIMED.pop(j.uri, None)
    with pytest.raises(Exception, match="belongs to streaming query query-a"):
        other.claim("query-b")
    log = j.part_log(1, 0)
    log.open()
    log.append(_batch("t", [5, 6]), attempt=1)  # acknowledgement not confirmed
    log.append(_batch("t", [7]), attempt=1)     # confirmed
    log.end(_end(1, acked=(1,)))
    probe = {("t", 0, 5), ("t", 0, 7), ("t", 0, 99)}
    assert j.find_journaled(probe) == {("t", 0, 5), ("t", 0, 7)}
    j.commit(1, dedup_retention_ms=3_600_000)
    assert _keys_under(s3_journal, "batches") == [], "the committed batch was not deleted"
    assert j.find_journaled(probe) == {("t", 0, 5)}, "unconfirmed keys must outlive the batch"
    assert "committed batch 1" in (j.in_use() or "")
    j.prune_dedup({"t:0": 7}, 1)
    assert j.find_journaled(probe) == set()


def test_a_late_attempt_after_the_commit_withdraws_and_its_orphans_are_swept(
    s3_journal: S3Journal,
) -> None:
    # No rename on S3: after the commit deleted batch 1, a late attempt's create succeeds.
    j = _journal(s3_journal)
    late = j.part_log(1, 0)
    late.open()  # opened while batch 1 was running
    done = j.part_log(1, 0)
    done.append(_batch("t", [0]), attempt=1)
    done.end(_end(1, acked=(0,)))
    j.commit(1, dedup_retention_ms=3_600_000)
    slot = late.append(_batch("t", [1]), attempt=2)  # succeeds: nothing is there any more
    assert j.committed_seq() >= 1, "the fence the task re-reads after every append"
    with pytest.raises(JournalClosed):
        j.part_log(1, 0).open()  # a new attempt sees the fence at once
    # The task would withdraw now; suppose it died first. Its records were never ACCEPTed,
    # so they must not become dedup keys, and the next commit deletes the orphan.
    assert slot == 0  # its scan at open saw an empty log
    nxt = j.part_log(2, 0)
    nxt.open()
    nxt.append(_batch("t", [2]), attempt=3)
    nxt.end(_end(3, acked=(0,)))
    j.commit(2, dedup_retention_ms=3_600_000)
    assert j.find_journaled({("t", 0, 1)}) == set(), "an orphan slot was taken as published"
    assert _keys_under(s3_journal, "batches") == [], "the orphan was not swept"


def test_a_retried_create_reported_as_existing_is_recognised_as_ours(
    s3_journal: S3Journal,
) -> None:
    j = _journal(s3_journal)
    log = j.part_log(1, 0)
    log.open()
    real = j.store.create_exclusive

    def retried(path: str, data: bytes, fsync: bool) -> bool:
        real(path, data, fsync)  # the first PUT succeeded, its response was lost; the retry
        return False             # gets 412

    j.store.create_exclusive = retried  # type: ignore[method-assign]
    assert log.append(_batch("t", [0]), attempt=7) == 0
    j.store.create_exclusive = real  # type: ignore[method-assign]
    assert j.part_log(1, 0).scan().data_slots == [0], "the batch was written twice"


# -- configuration and the checks at load() ----------------------------------------------------


_BASE = {"kafka.bootstrap.servers": "127.0.0.1:9", "kafka.group.id": "g", "subscribe": "t"}


def test_load_probes_the_store_and_carries_the_options_unshown(s3_journal: S3Journal) -> None:
    opts = parse_options({**_BASE, "journalPath": s3_journal.url, **s3_journal.options})
    assert dict(opts.journal_options) == s3_journal.store_options
    assert "testing" not in repr(opts)
    assert _keys_under(s3_journal, "") == [], "the probe object was left behind"
    j = Journal.of(opts)
    j.part_log(1, 0).open()
    assert j.part_log(1, 0).append(_batch("t", [0]), attempt=1) == 0


def test_load_refuses_settings_without_conditional_create_and_unreachable_stores(
    s3_journal: S3Journal,
) -> None:
    with pytest.raises(OptionError, match="conditional create"):
        parse_options({**_BASE, "journalPath": s3_journal.url, **s3_journal.options,
                       "journal.aws_conditional_put": "disabled"})
    with pytest.raises(OptionError, match="atomic create-if-absent") as info:
        parse_options({**_BASE, "journalPath": "s3://no-such-bucket-here/j",
                       **s3_journal.options})
    assert "testing" not in str(info.value)


def test_credentials_and_endpoint_from_the_standard_environment(
    s3: LocalS3, s3_journal: S3Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    parse_options({**_BASE, "journalPath": s3_journal.url})  # probe, no journal.* options
    j = Journal(s3_journal.url)
    j.part_log(1, 0).open()
    j.part_log(1, 0).append(_batch("t", [0]), attempt=1)
    assert _journal(s3_journal).part_log(1, 0).scan().data_slots == [0]


# -- failure tests with the journal on S3 --------------------------------------------------------


def _reader(spark: Any, kafka: LocalKafka, topics: list[str], group: str, where: S3Journal,
            **options: Any) -> Any:
    r = (spark.readStream.format("kafka-share")
         .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
         .option("kafka.group.id", group)
         .option("subscribe", ",".join(topics))
         .option("pollTimeoutMs", 1500)
         .option("journalPath", where.url))
    for k, v in {**where.options, **options}.items():
        r = r.option(k, v)
    return r.load()


def _start(df: Any, out: Path, chk: Path, available_now: bool = True) -> Any:
    w = (df.writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(chk)))
    return (w.trigger(availableNow=True) if available_now else w).start()


def _run_available_now(df: Any, out: Path, chk: Path) -> None:
    q = _start(df, out, chk)
    q.awaitTermination(240)
    assert not q.isActive, "the AvailableNow query did not finish"
    if q.exception() is not None:
        raise AssertionError(f"query failed: {q.exception()}")


def _sink_keys(spark: Any, out: Path) -> list[Key]:
    rows = spark.read.parquet(str(out)).select("topic", "partition", "offset").collect()
    return [(r.topic, r.partition, r.offset) for r in rows]


def _produce_spread(kafka: LocalKafka, topic: str, partitions: int, n: int) -> set[Key]:
    kafka.produce(topic, (ProducerRecord(value=b"v%d" % i, partition=i % partitions)
                          for i in range(n)), producer_config={"batch.size": "16384"})
    per = Counter(i % partitions for i in range(n))
    return {(topic, p, o) for p, c in per.items() for o in range(c)}


def _assert_exactly_once(got: list[Key], expected: set[Key]) -> None:
    dups = [k for k, c in Counter(got).items() if c > 1]
    assert not dups, f"{len(dups)} records delivered twice, e.g. {dups[:3]}"
    missing = expected - set(got)
    assert not missing, f"{len(missing)} records lost, e.g. {sorted(missing)[:3]}"
    assert set(got) == expected


def _drain(group: str, topics: list[str], share_consumer: Any, accept: bool,
           quiet_s: float) -> list[Key]:
    """What a plain consumer of the group still gets until ``quiet_s`` without records."""
    from confluent_kafka import AcknowledgeType

    c = share_consumer(group, topics)
    outcome = AcknowledgeType.ACCEPT if accept else AcknowledgeType.RELEASE
    seen: list[Key] = []
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < quiet_s:
        batch = c.poll(0.5)
        for m in batch:
            seen.append((m.topic(), m.partition(), m.offset()))
            c.acknowledge(m, outcome)
        if len(batch):
            c.commit_sync()
            quiet_since = time.monotonic()
    return seen


def test_two_racing_attempts_yield_identical_rows_and_lose_nothing(
    kafka: LocalKafka, topic_factory: Any, group: str, s3_journal: S3Journal,
    share_consumer: Any,
) -> None:
    topic = topic_factory(2)
    total = 4000
    kafka.produce(topic, (ProducerRecord(value=b"%d" % i, partition=i % 2) for i in range(total)),
                  producer_config={"batch.size": "2000"})
    options = parse_options({
        "kafka.bootstrap.servers": kafka.bootstrap_servers, "kafka.group.id": group,
        "subscribe": topic, "journalPath": s3_journal.url, "pollTimeoutMs": "1500",
        "kafka.max.poll.records": "200", **s3_journal.options})
    spec = TaskSpec(options=options, seq=1, part=0, parts=1, max_records=None, lock_ms=30_000)
    outputs: dict[str, list[Key]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def attempt(name: str) -> None:
        try:
            start.wait()
            rows: list[Key] = []
            for b in read_partition(spec):
                rows.extend(zip(b.column("topic").to_pylist(), b.column("partition").to_pylist(),
                                b.column("offset").to_pylist(), strict=True))
            outputs[name] = rows
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
    log = Journal.of(options).part_log(1, 0)
    scan = log.scan()
    assert scan.end is not None
    assert len({log.writer(slot) for slot in scan.data_slots}) == 2, \
        "only one attempt published: the race was not exercised"
    remaining = _drain(group, [topic], share_consumer, accept=True, quiet_s=6)
    assert not set(remaining) & set(emitted), "a record was both emitted and given back"
    assert sorted(emitted + remaining) == sorted(
        (topic, i % 2, i // 2) for i in range(total)), "a record was lost"


def test_worker_killed_after_publish_before_ack_loses_and_duplicates_nothing(
    spark: Any, kafka: LocalKafka, topic: str, group: str, tmp_path: Path,
    s3_journal: S3Journal, share_consumer: Any,
) -> None:
    kafka.set_group_config(group, "share.record.lock.duration.ms", 3000)
    expected = _produce_spread(kafka, topic, 1, 3000)
    df = _reader(spark, kafka, [topic], group, s3_journal, numPartitions=1,
                 _faultInjection="kill-after-publish:seq=1:part=0:attempt=0")
    _run_available_now(df, tmp_path / "out", tmp_path / "chk")
    time.sleep(4)  # the killed attempt's records are redelivered once their lock expires
    df2 = _reader(spark, kafka, [topic], group, s3_journal, numPartitions=2)
    _run_available_now(df2, tmp_path / "out", tmp_path / "chk")
    _assert_exactly_once(_sink_keys(spark, tmp_path / "out"), expected)
    assert _drain(group, [topic], share_consumer, accept=False, quiet_s=5) == [], \
        "redelivered duplicates were not acknowledged"
    j = _journal(s3_journal)
    dropped = sum((log_end.stats.get("duplicates_dropped", 0))
                  for seq in j.batches() for log_end in j.batch_ends(seq).values())
    assert dropped > 0 or _keys_under(s3_journal, "dedup"), \
        "the killed attempt's redelivered records were never recognised as duplicates"


def test_failed_batch_restarted_from_checkpoint_replays_exactly(
    spark: Any, kafka: LocalKafka, topic_factory: Callable[..., str], group: str,
    tmp_path: Path, s3_journal: S3Journal,
) -> None:
    topic = topic_factory(2)
    kafka.set_group_config(group, "share.record.lock.duration.ms", 3000)
    expected = _produce_spread(kafka, topic, 2, 6000)
    # Every attempt of task 0 of batch 1 fails before END: the query dies mid-batch.
    df = _reader(spark, kafka, [topic], group, s3_journal, numPartitions=2,
                 _faultInjection="fail-before-end:seq=1:part=0")
    q = _start(df, tmp_path / "out", tmp_path / "chk")
    with pytest.raises(Exception, match="injected failure: fail-before-end"):
        q.awaitTermination(240)
    j = _journal(s3_journal)
    journaled = sum(len(j.part_log(1, p).scan().data_slots) for p in (0, 1))
    assert journaled >= 1, "nothing was journaled; the test proves nothing"
    df2 = _reader(spark, kafka, [topic], group, s3_journal, numPartitions=2)
    _run_available_now(df2, tmp_path / "out", tmp_path / "chk")
    _assert_exactly_once(_sink_keys(spark, tmp_path / "out"), expected)


def test_query_stopped_mid_batch_and_restarted_from_checkpoint(
    spark: Any, kafka: LocalKafka, topic_factory: Callable[..., str], group: str,
    tmp_path: Path, s3_journal: S3Journal,
) -> None:
    topic = topic_factory(2)
    kafka.set_group_config(group, "share.record.lock.duration.ms", 3000)
    expected = _produce_spread(kafka, topic, 2, 4000)
    # Task 0 of batch 1 is held before END (after journaling and acknowledging) while the
    # test stops the query.
    df = _reader(spark, kafka, [topic], group, s3_journal, numPartitions=2,
                 _faultInjection="sleep-before-end:seq=1:part=0:ms=60000")
    q = _start(df, tmp_path / "out", tmp_path / "chk", available_now=False)
    j = _journal(s3_journal)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and j.part_log(1, 1).scan().end is None:
        time.sleep(0.2)
    time.sleep(1)
    assert q.isActive, "the query ended before it could be stopped mid-batch"
    q.stop()
    assert not (tmp_path / "out" / "_spark_metadata" / "0").exists(), \
        "the batch was committed to the sink: the stop did not interrupt it"
    df2 = _reader(spark, kafka, [topic], group, s3_journal, numPartitions=2)
    _run_available_now(df2, tmp_path / "out", tmp_path / "chk")
    _assert_exactly_once(_sink_keys(spark, tmp_path / "out"), expected)


# -- the harness ---------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too
        return f.read().split()[2] != "Z"


@pytest.mark.parametrize("how", ["exit", "sigterm", "sigkill"])
def test_the_s3_server_never_outlives_its_owner(how: str, tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    script = tmp_path / "owner.py"
    script.write_text(
        "import sys, time\n"
        "from pyspark_kafka_share.localkafka import LocalS3\n"
        "s3 = LocalS3().start()\n"
        "print(s3.pid, flush=True)\n"
        f"time.sleep(0 if {how == 'exit'!r} else 60)\n")
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    server = int(owner.stdout.readline())
    assert _alive(server)
    if how != "exit":
        os.kill(owner.pid, signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
    owner.wait(30)
    deadline = time.monotonic() + 15
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(server), f"the S3 server outlived its owner ({how})"
