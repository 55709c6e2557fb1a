"""Queue workers with exactly-once outputs (``exactly_once_outputs=True``), failures injected for
real: a real broker (the session's, or a test's own that is SIGKILLed) and real Spark.

Every test ends with a ``read_committed`` consumer of the output and dead-letter topics seeing
every origin (``kafka-share.origin.*`` headers) exactly once, and with evidence that the
failure happened (aborted records a ``read_uncommitted`` reader sees, records acknowledged
from a committed marker without running the function, aborted transactions).
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share.errors import Fenced, OptionError
from pyspark_kafka_share.harness import LocalKafka
from pyspark_kafka_share.workers import Record, Result, WorkerSummary, run_workers, start_workers
from pyspark_kafka_share.workers.config import ShareClient, WorkerConfig
from pyspark_kafka_share.workers.exactly_once import (
    MarkerSet,
    Transactions,
    ensure_marker_topic,
    marker_topic,
    transactional_id,
)
from tests.fixtures.kafka import TopicFactory
from tests.helpers import (
    Key,
    assert_exactly_once,
    assert_killed_attempt_lost,
    explain_missing,
    group_lag,
    output_origins,
    produce_spread,
    read_topic,
    stop_when_drained,
    wait_for,
    worker_faults,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

N = 60  # records per test, over 2 partitions
LOCK_MS = 8_000
Explain = Callable[[set[Key], list[Key]], str]  # (missing origins, dead letters) -> why


def _poison(value: bytes) -> bool:
    return int(value[1:]) % 7 == 0


def _work(log: str) -> Any:
    """The worker function: every 7th record is poison, the others ACCEPTed with an output;
    each call leaves a line in ``log``."""

    def work(rec: Record) -> Result:
        with open(log, "a") as f:
            f.write(json.dumps({"value": (rec.value or b"").decode(),
                                "dc": rec.delivery_count}) + "\n")
        value = rec.value or b""
        if _poison(value):
            return Result.reject("poison")
        return Result.accept(value + b"-out")

    return work


def _calls(log: str) -> Counter[str]:
    path = Path(log)
    lines = path.read_text().splitlines() if path.exists() else []
    return Counter(json.loads(line)["value"] for line in lines if line)


def _header(m: Message, name: str) -> bytes:
    v = dict(m.headers() or []).get(name)
    return v.encode() if isinstance(v, str) else v or b""


def _keys(src: str) -> dict[Key, bytes]:
    return {(src, i % 2, i // 2): b"v%d" % i for i in range(N)}


def _deliveries(src: str, log: str) -> dict[Key, list[int]]:
    """The delivery counts the worker function saw, per origin (from its ``log``)."""
    by_value = {v.decode(): k for k, v in _keys(src).items()}
    path = Path(log)
    out: dict[Key, list[int]] = {}
    for line in (path.read_text().splitlines() if path.exists() else []):
        call = json.loads(line)
        out.setdefault(by_value[call["value"]], []).append(int(call["dc"]))
    return out


def _assert_each_origin_once(kafka: LocalKafka, src: str, out: str, dlq: str,
                             explain: Explain | None = None) -> int:
    """read_committed: each origin once in ``out`` (good records) or ``dlq`` (poison); the
    count of records a read_uncommitted reader sees in ``out`` beyond them (aborted). With
    ``explain``, origins missing from both fail with its account of them."""
    keys = _keys(src)
    poison = {k for k, v in keys.items() if _poison(v)}
    outputs = read_topic(kafka, out, N - len(poison), settle_s=1.0)
    dead = output_origins(read_topic(kafka, dlq, len(poison), settle_s=1.0))
    missing = set(keys) - set(output_origins(outputs)) - set(dead)
    if explain is not None and missing:
        pytest.fail(explain(missing, dead))
    assert_exactly_once(output_origins(outputs), set(keys) - poison)
    for m in outputs:
        assert m.value() == keys[output_origins([m])[0]] + b"-out"
    assert_exactly_once(dead, poison)
    seen = read_topic(kafka, out, N - len(poison), settle_s=1.0, isolation="read_uncommitted")
    return len(seen) - len(outputs)


def _run(spark: SparkSession, kafka: LocalKafka, src: str, out: str, dlq: str, group: str,
         log: str, settled: Callable[[], bool] | None = None, retried: tuple[int, ...] = (),
         **options: Any) -> WorkerSummary:
    """The workers over ``src``, stopped once every record is acknowledged (and ``settled``,
    and the ``retried`` workers' retries reported): an idle timeout (12 s) stopped them with
    records left on a loaded machine."""
    kafka.set_group_config(group, "share.record.lock.duration.ms", LOCK_MS)
    job = start_workers(spark, _work(log), topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2, chunk_size=5,
                        output_topic=out, dead_letter_topic=dlq, exactly_once_outputs=True,
                        on_progress=False, **options)
    return stop_when_drained(job, kafka, group, settled=settled, retried=retried)



def _every_attempt_lived(summary: WorkerSummary) -> bool:
    """Whether no task attempt died. The exact counts of calls and totals hold only then: on a
    loaded machine Spark may lose an attempt the test did not kill (a Python worker or a task
    timing out), whose records come back and run again, and whose totals stop at its last
    report. What was lost or duplicated in the outputs is each test's check either way (a
    lost attempt's open transaction is aborted when its retry starts)."""
    if summary.failed_attempts:
        print(f"an attempt died: the exact counts are not checked\n{summary}")
        return False
    return True


def _stat(summary: WorkerSummary, name: str) -> int:
    return sum(int(w.get(name, 0)) for w in summary.workers)


def _live_markers(kafka: LocalKafka, group: str) -> int:
    markers = MarkerSet()
    for m in read_topic(kafka, marker_topic(group), 0, settle_s=1.0):
        markers.apply(m.key() or b"", m.value())
    return len(markers)


def test_outputs_dead_letters_and_markers_commit_in_one_transaction(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
    tmp_path: Path,
) -> None:
    src, out, dlq = topic_factory(2), topic_factory(1), topic_factory(1)
    produce_spread(kafka, src, 2, N)
    log = str(tmp_path / "calls.jsonl")
    # Every marker's acknowledgement confirmed and tombstoned (a worker does that idle).
    summary = _run(spark, kafka, src, out, dlq, group, log,
                   settled=lambda: _live_markers(kafka, group) == 0)
    t = summary.totals
    poison = sum(1 for i in range(N) if i % 7 == 0)
    assert (t["accepted"], t["rejected"], t["outputs"], t["dead_lettered"]) == \
        (N - poison, poison, N - poison, poison), str(summary)
    assert _assert_each_origin_once(kafka, src, out, dlq) == 0
    assert set(_calls(log).values()) == {1}
    # The default transaction_interval_s: the chunks of a poll share transactions.
    assert 1 <= _stat(summary, "transactions") <= N // 5
    # Every marker's acknowledgement was confirmed: tombstoned, the live set is empty.
    assert _live_markers(kafka, group) == 0
    # The marker topic is compacted; a second start checks it and leaves it.
    client = WorkerConfig.create(topics=src, group=group,
                                 bootstrap_servers=kafka.bootstrap_servers).client
    assert ensure_marker_topic(client) == marker_topic(group)


def _worker_0_killed(kafka: LocalKafka, topic_factory: TopicFactory, group: str,
                     spark: SparkSession, tmp_path: Path, fault: str,
                     **options: Any) -> tuple[WorkerSummary, tuple[str, str, str], str]:
    """N records in 2 partitions run with the fault ``fault``, which kills worker 0's first
    attempt: the summary (that attempt among its failed attempts: a loaded machine may lose
    another, retried too), (source, output, dead-letter topic) and the call log."""
    src, out, dlq = topic_factory(2), topic_factory(1), topic_factory(1)
    produce_spread(kafka, src, 2, N)
    log = str(tmp_path / "calls.jsonl")
    # Until Spark's retry of worker 0 reported: its fencing aborts the dead attempt's open
    # transaction (the others may drain the queue before the retry starts).
    summary = _run(spark, kafka, src, out, dlq, group, log, retried=(0,), **options,
                   **worker_faults(fault))
    assert_killed_attempt_lost(summary, 0)
    return summary, (src, out, dlq), log


@pytest.mark.parametrize(("point", "client"), [
    ("kill-after-commit", "librdkafka"), ("kill-before-commit", "librdkafka"),
    ("kill-during-commit", "librdkafka"),
    ("kill-after-commit", "native"),  # the other client, on the point with the most to check
])
def test_a_worker_killed_around_the_commit_duplicates_nothing(
    point: str, client: ShareClient, kafka: LocalKafka, topic_factory: TopicFactory,
    group: str, spark: SparkSession, tmp_path: Path,
) -> None:
    """The Python worker of worker 0 dies (``os._exit``) at its 3rd transaction: after the
    commit and before the acknowledgement, between the produce and the commit, or while the
    commit runs. Spark retries the task; the records come back when the lock expires. One
    transaction per chunk (``transaction_interval_s=0``), so that worker 0 has a 3rd."""
    summary, (src, out, dlq), log = _worker_0_killed(
        kafka, topic_factory, group, spark, tmp_path, f"{point}:part=0:attempt=0:seq=3:ms=3",
        transaction_interval_s=0, client=client)
    aborted = _assert_each_origin_once(kafka, src, out, dlq)
    calls = _calls(log)
    assert set(calls) == {f"v{i}" for i in range(N)}
    if point == "kill-after-commit":
        # The committed chunk came back and was acknowledged from its marker, not run again.
        assert _stat(summary, "already_committed") >= 1, str(summary.workers)
        assert aborted == 0
    if point == "kill-before-commit":
        assert aborted >= 1  # the dead attempt's outputs, aborted by the retry's fencing
        assert max(calls.values()) == 2


def test_a_worker_killed_with_chunks_in_an_open_transaction_duplicates_nothing(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
    tmp_path: Path,
) -> None:
    """Worker 0 dies once two chunks wait in its first transaction (``transaction_interval_s``
    long enough to hold them): nothing of them was produced or acknowledged, so they all come
    back (lock expiry) and are processed again, their outputs once for ``read_committed``."""
    summary, (src, out, dlq), log = _worker_0_killed(
        kafka, topic_factory, group, spark, tmp_path,
        "kill-in-open-transaction:part=0:attempt=0:seq=1:chunks=2", transaction_interval_s=30)
    # Produced only at the commit: not even a read_uncommitted reader sees aborted outputs.
    assert _assert_each_origin_once(kafka, src, out, dlq) == 0
    calls = _calls(log)
    assert set(calls) == {f"v{i}" for i in range(N)}
    assert sum(1 for n in calls.values() if n == 2) >= 10, calls  # the two chunks, again
    assert _stat(summary, "already_committed") == 0, str(summary.workers)


def test_a_broker_crash_mid_transaction_duplicates_nothing(
    chaos_kafka: LocalKafka, spark: SparkSession, tmp_path: Path,
) -> None:
    """The broker is SIGKILLed while worker 0 sits between its produce and its commit (a
    4 s pause), and restarted on its data 2 s later: the acquisitions are lost, the records
    come back (as first deliveries), the transaction is not committed on a lost session.

    No idle timeout: the driver judges idleness by the time since each worker's last record,
    and the outage, the restart and the coordinators' reload count as idle; on a loaded
    machine they outlast any short idle timeout and the job stopped with records unprocessed
    (lag left, no loss). The workers are stopped once the group's lag is 0: every record
    acknowledged for good."""
    kafka = chaos_kafka
    src = kafka.create_topic("eos-src", 2)
    out, dlq = kafka.create_topic("eos-out", 1), kafka.create_topic("eos-dlq", 1)
    group = "eos-broker-crash"
    kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
    kafka.set_group_config(group, "share.record.lock.duration.ms", 12_000)
    produce_spread(kafka, src, 2, N)
    log = str(tmp_path / "calls.jsonl")
    job = start_workers(spark, _work(log), topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2, chunk_size=5,
                        output_topic=out, dead_letter_topic=dlq, exactly_once_outputs=True,
                        on_progress=False, broker_timeout_s=60,
                        transaction_interval_s=0,  # one per chunk: worker 0 has a 2nd
                        **worker_faults("sleep-before-commit:part=0:attempt=0:seq=2:ms=4000"))
    try:
        # Worker 0 committed one transaction and processed its second chunk: in the pause.
        wait_for(lambda: job.progress().workers.get(0, {}),
                 lambda w: w.get("transactions", 0) >= 1 and w.get("processed", 0) >= 6,
                 timeout_s=120, what="worker 0 in its second transaction")
        kafka.kill()
        time.sleep(2)
        kafka.restart()
        # Generous: the lost acquisitions come back once the share partitions are loaded
        # again, and records a worker held in a failed transaction wait for their lock.
        deadline = time.monotonic() + 300
        while (lag := group_lag(kafka, group)) != 0 and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        summary = job.stop("the test is done", grace_s=120)
    assert summary is not None
    explain: Explain = lambda missing, dead: explain_missing(  # noqa: E731
        kafka, group, summary, missing, dead, _deliveries(src, log))
    _assert_each_origin_once(kafka, src, out, dlq, explain)
    assert lag == 0, explain(set(), [])
    assert _stat(summary, "transactions_aborted") >= 1, str(summary.workers)
    assert not any(str(w.get("stop_reason")).startswith("fenced") for w in summary.workers), \
        str(summary)


def test_a_zombie_past_its_lock_commits_nothing(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
    tmp_path: Path,
) -> None:
    """Worker 0 pauses between produce and commit for longer than the lock: the broker hands
    its records to worker 1, and worker 0 must not commit (the deadline check aborts)."""
    src, out, dlq = topic_factory(2), topic_factory(1), topic_factory(1)
    produce_spread(kafka, src, 2, N)
    log = str(tmp_path / "calls.jsonl")
    summary = _run(spark, kafka, src, out, dlq, group, log, transaction_interval_s=0,
                   **worker_faults(f"sleep-before-commit:part=0:seq=2:ms={LOCK_MS + 2000}"))
    explain: Explain = lambda missing, dead: explain_missing(  # noqa: E731
        kafka, group, summary, missing, dead, _deliveries(src, log))
    assert _assert_each_origin_once(kafka, src, out, dlq, explain) >= 1
    assert _stat(summary, "transactions_aborted") >= 1, str(summary.workers)


def _values_from(n: int) -> Callable[[int], bytes]:
    """Values ``v<n>``, ``v<n+1>``, ... for :func:`produce_spread`."""
    return lambda i: b"v%d" % (n + i)


def test_records_handed_to_two_workers_are_committed_once(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
    tmp_path: Path,
) -> None:
    """Issue 37, the window the barrier and the deadline leave: a record handed to a second
    worker while the first still goes on to commit it (on a cluster: its acquisition dropped
    by a leader move with nobody told), the second's barrier begun before the first's marker
    was written. Here worker 0's first transaction waits ``LOCK_MS`` + 2 s before it produces
    (``sleep-before-produce``), so its records go to worker 1 when their lock expires, and
    then passes its deadline check regardless (``ignore-deadline``: an acquisition lost with
    nobody told, which the deadline cannot see). Both produce a marker over the chunk; the
    commit check of the one whose marker is later finds the other's and aborts. With the check
    disabled, 2 of the 60 origins were output twice (2026-11-27; docs/design.md).

    One source partition, fed a record at a time until worker 0 got one: with as many workers
    as partitions the broker's assignor gives each partition to one member (worker 0's records
    came back to worker 0), and a member that joins late gets nothing of a burst."""
    src, out, dlq = topic_factory(1), topic_factory(1), topic_factory(1)
    log = str(tmp_path / "calls.jsonl")
    kafka.set_group_config(group, "share.record.lock.duration.ms", LOCK_MS)
    late = "part=0:attempt=0:seq=1"
    job = start_workers(spark, _work(log), topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2, chunk_size=5,
                        output_topic=out, dead_letter_topic=dlq, exactly_once_outputs=True,
                        on_progress=False, transaction_interval_s=0,
                        **worker_faults(f"sleep-before-produce:{late}:ms={LOCK_MS + 2000};"
                                        f"ignore-deadline:{late}"))
    sent = 0
    try:
        wait_for(lambda: job.progress().workers, lambda w: len(w) == 2, timeout_s=120,
                 what="both workers running")
        # A record at a time until worker 0 got one (its first transaction is the late one).
        while sent < N and not job.progress().workers.get(0, {}).get("received"):
            produce_spread(kafka, src, 1, 1, value=_values_from(sent))
            sent += 1
            time.sleep(0.3)
        if sent < N:
            produce_spread(kafka, src, 1, N - sent, value=_values_from(sent))
        wait_for(lambda: job.progress().workers.get(0, {}), lambda w: bool(w.get("received")),
                 timeout_s=60, what="worker 0 getting records")
    except BaseException:
        job.stop("the test failed", grace_s=60)
        raise
    keys = {(src, 0, n) for n in range(N)}  # one partition: record n at offset n

    def worker_0_decided() -> bool:  # its late transaction committed or aborted
        w = job.progress().workers.get(0, {})
        return int(w.get("transactions", 0)) + int(w.get("transactions_aborted", 0)) >= 1

    summary = stop_when_drained(job, kafka, group, settled=worker_0_decided)
    print(summary, summary.workers)  # shown if it fails
    poison = {(src, 0, i) for i in range(N) if _poison(b"v%d" % i)}
    outputs = read_topic(kafka, out, N - len(poison), settle_s=1.0)
    assert_exactly_once(output_origins(outputs), keys - poison)
    assert_exactly_once(output_origins(read_topic(kafka, dlq, len(poison), settle_s=1.0)),
                        poison)
    # The window was hit: a transaction found another attempt's marker over its records.
    assert _stat(summary, "marker_overlaps_aborted") >= 1, str(summary.workers)
    assert _stat(summary, "marker_conflicts") == 0, str(summary.workers)


def test_an_older_attempt_of_a_worker_slot_is_fenced(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str,
) -> None:
    """Two attempts of one worker slot (an executor thought lost, a speculative copy): the
    newer one's ``init_transactions`` fences the older, whose commit then fails."""
    out = topic_factory(1)
    client = WorkerConfig.create(topics=out, group=group,
                                 bootstrap_servers=kafka.bootstrap_servers).client
    topic = ensure_marker_topic(client)
    conf = client.producer()
    old = Transactions.start(conf, transactional_id(group, 0), topic, 10.0, 10.0)
    old.begin()
    old.producer.produce(out, value=b"zombie")
    old.producer.flush(10)
    new = Transactions.start(conf, transactional_id(group, 0), topic, 10.0, 10.0)
    new.begin()
    new.producer.produce(out, value=b"winner")
    new.commit()
    with pytest.raises(Fenced, match="fenced"):
        old.commit()
    assert [m.value() for m in read_topic(kafka, out, 1, settle_s=1.0)] == [b"winner"]
    for t in (old, new):
        t.close()


def test_records_already_committed_are_not_run_again(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
    tmp_path: Path,
) -> None:
    """A committed marker decides: a record it covers that comes back is ACCEPTed or REJECTed
    as the marker says, without running the function or producing. Here a marker covering
    every record is committed before the workers start (as a worker that died after its
    commit leaves it)."""
    from pyspark_kafka_share.workers.exactly_once import encode_marker
    from pyspark_kafka_share.workers.outcome import Outcome

    src, out, dlq = topic_factory(2), topic_factory(1), topic_factory(1)
    produce_spread(kafka, src, 2, N)
    client = WorkerConfig.create(topics=src, group=group,
                                 bootstrap_servers=kafka.bootstrap_servers).client
    topic = ensure_marker_topic(client)
    txn = Transactions.start(client.producer(), transactional_id(group, 9), topic, 10.0, 10.0)
    txn.begin()
    txn.producer.produce(topic, key=b"earlier", value=encode_marker(
        [(src, i % 2, i // 2, Outcome.REJECT if i % 7 == 0 else Outcome.ACCEPT)
         for i in range(N)]))
    txn.commit()
    txn.close()
    log = str(tmp_path / "calls.jsonl")
    summary = _run(spark, kafka, src, out, dlq, group, log)
    assert _calls(log) == Counter()
    assert (summary.totals["accepted"], summary.totals["rejected"]) == (N - 9, 9)
    assert _stat(summary, "already_committed") == N
    assert read_topic(kafka, out, 0, settle_s=1.0) == []


def test_a_marker_topic_that_is_not_compacted_is_refused(
    kafka: LocalKafka, topic: str, group: str, spark: SparkSession,
) -> None:
    """Retention would delete markers whose records can still come back: refused at start,
    before any task, naming the topic and the fix."""
    kafka.create_topic(marker_topic(group), 1, config={"cleanup.policy": "delete"})
    with pytest.raises(OptionError, match=r"'exactly_once_outputs'.*cleanup.policy='delete'.*"
                                          r"Set cleanup.policy=compact"):
        run_workers(spark, lambda r: None, topics=topic, group=group,
                    bootstrap_servers=kafka.bootstrap_servers, exactly_once_outputs=True,
                    on_progress=False)
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


# The input whose output is larger than the output topic takes. One: a worker fails after 3
# chunks in a row with a refused produce, and a record's redeliveries often come back in a row.
BIG = {13}
# The broker refuses a whole batch, and the abort fails the rest of the transaction: every
# output of the transaction is reported refused with the large one (docs/workers.md); the
# worker halves them until the large one is alone, so its neighbours lose no attempt. Several
# records a chunk, several chunks a transaction (the default transaction_interval_s).
REFUSED_CHUNK = 10


def _work_big(log: str) -> Any:
    """As :func:`_work`, but the outputs of the ``BIG`` inputs are too large for the output
    topic (``max.message.bytes``): the broker refuses them inside the transaction."""
    work = _work(log)

    def big(rec: Record) -> Result:
        result: Result = work(rec)
        if int((rec.value or b"v0")[1:]) in BIG:
            return Result.accept(b"x" * 4000)
        return result

    return big


def test_a_produce_refused_inside_a_transaction_aborts_it_and_releases(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
    tmp_path: Path,
) -> None:
    """An output is too large for the output topic: the broker refuses it inside its chunk's
    transaction, which aborts; its record is RELEASEd (never ACCEPTed), run again until
    ``max_attempts`` and then dead-lettered, with the refusal in the dead letter's error; the
    rest of its transaction (other records of its chunk and other chunks, whose produce the
    abort failed too) is committed in a second transaction and loses no attempt."""
    src, dlq = topic_factory(2), topic_factory(1)
    out = kafka.create_topic(f"eos-small-{group}", 1, config={"max.message.bytes": "1000"})
    produce_spread(kafka, src, 2, N)
    log = str(tmp_path / "calls.jsonl")
    # A lock 30 s long, not LOCK_MS (8 s): the test counts attempts exactly, and on a loaded
    # machine (stress-ng beside it) the aborts and producer replacements outlasted the 8 s
    # lock's budget: the worker released the chunks at their lock deadline, each release a
    # delivery, and the large record was dead-lettered "after 5 attempts", not 2. Nothing here
    # waits for a lock to expire.
    kafka.set_group_config(group, "share.record.lock.duration.ms", 30_000)
    job = start_workers(spark, _work_big(log), topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2,
                        chunk_size=REFUSED_CHUNK, output_topic=out, dead_letter_topic=dlq,
                        exactly_once_outputs=True, max_attempts=2, on_progress=False)
    summary = stop_when_drained(job, kafka, group)
    keys = {(src, i % 2, i // 2): i for i in range(N)}
    to_dlq = {k for k, i in keys.items() if _poison(b"v%d" % i) or i in BIG}
    outputs = read_topic(kafka, out, N - len(to_dlq), settle_s=1.0)
    dead = read_topic(kafka, dlq, len(to_dlq), settle_s=1.0)
    errors = {output_origins([m])[0]: _header(m, "kafka-share.error") for m in dead}
    print(f"{summary}\n{summary.workers}\ndead letters: {errors}")  # shown if it fails
    assert_exactly_once(output_origins(outputs), set(keys) - to_dlq)
    assert_exactly_once(output_origins(dead), to_dlq)
    for k, i in keys.items():
        if i in BIG:  # the refusal, as docs/workers.md says: an output refused is a retry
            assert re.search(rb"gave up after 2 attempts: output not delivered: .*too large",
                             errors[k], re.IGNORECASE), errors[k]
    t = summary.totals
    # The refusals were settled by the worker (aborted, counted), not by its death.
    assert t["transactions_aborted"] >= 2 and t["produce_failures"] >= 2, str(summary)
    if _every_attempt_lived(summary):
        calls = _calls(log)
        assert {f"v{i}": calls[f"v{i}"] for i in BIG} == {f"v{i}": 2 for i in BIG}  # RELEASEd
        assert (t["accepted"], t["rejected"]) == (N - len(to_dlq), len(to_dlq)), str(summary)
        assert t["exhausted"] == len(BIG), str(summary)


@pytest.mark.parametrize("committed", [1, 0], ids=["went-through", "did-not"])
def test_a_commit_whose_outcome_is_unknown_is_not_acknowledged(
    committed: int, kafka: LocalKafka, topic_factory: TopicFactory, group: str,
    spark: SparkSession, tmp_path: Path,
) -> None:
    """Worker 0's ``commit_transaction`` raises the retriable timeout of a lost reply (the
    test-only fault ``timeout-commit``), after the commit went through or without it: the
    worker cannot know which, so it must not acknowledge the chunk as processed. It RELEASEs
    it and replaces its producer (whose ``init_transactions`` completes or aborts the
    transaction); when the records come back the marker check decides: ACCEPT from the marker,
    or run again. A read_committed reader sees every origin exactly once."""
    src, out, dlq = topic_factory(2), topic_factory(1), topic_factory(1)
    produce_spread(kafka, src, 2, N)
    log = str(tmp_path / "calls.jsonl")
    summary = _run(spark, kafka, src, out, dlq, group, log, transaction_interval_s=0,
                   **worker_faults(  # one transaction per chunk: worker 0 has a 2nd
                       f"timeout-commit:part=0:attempt=0:seq=2:committed={committed}"))
    # What must hold: nothing lost (a chunk acknowledged after a commit that did not go
    # through), nothing twice (one run again after a commit that did) ...
    aborted = _assert_each_origin_once(kafka, src, out, dlq)
    t = summary.totals
    # ... and the unknown outcome handled by the worker (its producer replaced), not by its
    # death, and decided as documented.
    assert t["transactions_aborted"] >= 1 and t["producers_replaced"] >= 1, str(summary)
    if committed:  # the chunk came back and its marker decided it
        assert t["already_committed"] >= 1, str(summary)
    else:  # aborted by the new producer
        assert aborted >= 1, str(summary)
    if _every_attempt_lived(summary):
        assert (t["accepted"], t["rejected"]) == (N - 9, 9), str(summary)
        calls = _calls(log)
        if committed:  # not run again
            assert set(calls.values()) == {1}, str(summary)
        else:  # run again, once
            assert max(calls.values()) == 2, str(summary)


def _released_first(log: str) -> Any:
    """:func:`_work`, but a record's first delivery is RELEASEd untouched: with a delivery
    limit of 2 every record is processed on its last delivery."""
    work: Callable[[Record], Result] = _work(log)

    def released_first(rec: Record) -> Result:
        if rec.delivery_count < 2:
            return Result.release("first delivery")
        return work(rec)

    return released_first


@pytest.mark.parametrize("client", ["librdkafka", "native"])
def test_a_commit_failed_on_the_last_delivery_loses_nothing(
    client: ShareClient, kafka: LocalKafka, topic_factory: TopicFactory, group: str,
    spark: SparkSession, tmp_path: Path,
) -> None:
    """Issue 37: the group's ``share.delivery.count.limit`` at its minimum (2) and every
    record's first delivery RELEASEd, so each transaction with a marker holds records on their
    last delivery; each worker's first one fails its commit with the retriable timeout of a
    lost reply, the transaction not committed (``timeout-commit:committed=0``). A RELEASE there
    made the broker archive the records: no output, no dead letter (on main: the outputs of
    the first transactions missing). Now the worker replaces its producer (which aborts the
    transaction), reads the markers (none covers them) and commits them in a new transaction:
    every origin once for a read_committed reader, nothing archived. With the native client
    the records are RENEWed before the new transaction."""
    src, out, dlq = topic_factory(2), topic_factory(1), topic_factory(1)
    produce_spread(kafka, src, 2, N)
    log = str(tmp_path / "calls.jsonl")
    kafka.set_group_config(group, "share.delivery.count.limit", 2)
    # A lock 30 s long: the test waits for no lock to expire (the RELEASEs redeliver at once),
    # and the retry (a new producer, a marker read, a transaction) must fit in its budget on a
    # loaded machine.
    kafka.set_group_config(group, "share.record.lock.duration.ms", 30_000)
    job = start_workers(spark, _released_first(log), topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2, chunk_size=5,
                        output_topic=out, dead_letter_topic=dlq, exactly_once_outputs=True,
                        max_attempts=2, on_progress=False, client=client,
                        **worker_faults("timeout-commit:attempt=0:seq=1:committed=0"))
    summary = stop_when_drained(job, kafka, group)
    print(f"{summary}\n{summary.workers}")  # shown if it fails
    aborted = _assert_each_origin_once(kafka, src, out, dlq)
    t = summary.totals
    assert aborted >= 1, str(summary)  # the failed commit's outputs, aborted
    assert t["transactions_aborted"] >= 1 and t["producers_replaced"] >= 1, str(summary)
    assert t["last_delivery_retries"] >= 1 and t["last_delivery_archived"] == 0, str(summary)
    if client == "native":  # every RENEW (the commit checks', the retries') confirmed
        assert t["renewed"] >= 1 and t["renew_failures"] == 0, str(summary)
    if _every_attempt_lived(summary):
        assert (t["accepted"], t["rejected"]) == (N - 9, 9), str(summary)
        assert set(_calls(log).values()) == {1}, str(summary)  # run once, on the last delivery
