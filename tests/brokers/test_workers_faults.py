"""The queue workers with exactly-once outputs on the three-broker cluster: the broker that
coordinates the share group SIGKILLed while a worker sits between its produce and its commit
(the group's coordination moves to another node); latency, connection resets and a slow drip
on a source partition leader's link under a steady producer; a Python worker SIGSTOPped past
its lock and resumed after the other worker took its records (a zombie that wakes up); clean
leader moves under commits held open. Each ends with a ``read_committed`` reader of the output
and dead-letter topics seeing every origin exactly once (the leader moves: with the native
client; with librdkafka the remaining window is measured). The coordinator kill and the
leader moves run with both clients (``client``: the CI subset keeps librdkafka's only)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share.harness import LocalKafka, LocalKafkaCluster
from pyspark_kafka_share.harness.toxiproxy import Toxiproxy
from pyspark_kafka_share.workers import Record, Result, WorkerJob, WorkerSummary, start_workers
from pyspark_kafka_share.workers.config import ShareClient
from tests.brokers.network import check_hits, more_than, run_network_faults
from tests.chaos.chaos_harness import SteadyProducer
from tests.fixtures.brokers import ClusterTopicFactory
from tests.helpers import (
    Key,
    assert_exactly_once,
    group_lag,
    output_origins,
    produce_spread,
    read_topic,
    spread_keys,
    stop_when_drained,
    wait_for,
    worker_faults,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

N = 200  # records over 2 partitions
# Both clients; make test-brokers-ci (marker brokers_ci) keeps librdkafka's run only.
CLIENTS = [pytest.param("librdkafka", marks=pytest.mark.brokers_ci), "native"]


@contextlib.contextmanager
def _producing(job: WorkerJob, producer: SteadyProducer) -> Iterator[None]:
    """``producer`` running for the block; a failure stops ``job`` (then raises), and the
    producer is finished and joined either way."""
    producer.start()
    try:
        yield
    except BaseException:
        job.stop("the test failed", grace_s=60)
        raise
    finally:
        producer.finish()
        producer.join(300)


def _poison(value: bytes) -> bool:
    """Every 7th record (values ``v<i>`` of produce_spread, ``<i>`` of SteadyProducer)."""
    return int(value.lstrip(b"v")) % 7 == 0


def _work(rec: Record) -> Result:
    value = rec.value or b""
    return Result.reject("poison") if _poison(value) else Result.accept(value + b"-out")


@pytest.mark.parametrize("client", CLIENTS)
def test_workers_exactly_once_outputs_when_the_group_coordinator_is_killed_mid_transaction(
    spark: SparkSession, kafka_cluster: LocalKafkaCluster, cluster_broker: LocalKafka,
    cluster_topic_factory: ClusterTopicFactory, cluster_group: str,
    fault_report: Callable[[str], None], client: ShareClient,
) -> None:
    src, out, dlq = (cluster_topic_factory(n) for n in (2, 1, 1))
    kafka_cluster.set_group_config(cluster_group, "share.record.lock.duration.ms", 12_000)
    produce_spread(cluster_broker, src, 2, N)
    keys = spread_keys(src, 2, N)
    poison = {(src, i % 2, i // 2) for i in range(N) if _poison(b"v%d" % i)}
    job = start_workers(spark, _work, topics=src, group=cluster_group, client=client,
                        bootstrap_servers=kafka_cluster.bootstrap_servers, workers=2,
                        chunk_size=5, output_topic=out, dead_letter_topic=dlq,
                        exactly_once_outputs=True, on_progress=False, broker_timeout_s=60,
                        transaction_interval_s=0,
                        **worker_faults("sleep-before-commit:part=0:attempt=0:seq=2:ms=4000"))
    try:
        wait_for(lambda: job.progress().workers.get(0, {}),
                 lambda w: w.get("transactions", 0) >= 1 and w.get("processed", 0) >= 6,
                 timeout_s=180, what="worker 0 in its second transaction")
        node = kafka_cluster.group_coordinator(cluster_group)
        kafka_cluster.kill(node)
        moved = wait_for(lambda: kafka_cluster.group_coordinator(cluster_group),
                         lambda n: n != node, 60, "the group's coordinator moved")
        deadline = time.monotonic() + 300
        while (lag := group_lag(cluster_broker, cluster_group)) != 0 \
                and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        summary = job.stop("the test is done", grace_s=120)
    assert summary is not None
    aborted = sum(int(w.get("transactions_aborted", 0)) for w in summary.workers)
    conflicts = sum(int(w.get("marker_conflicts", 0)) for w in summary.workers)
    slowest = max((int(w.get("txn_commit_max_ms", 0)) for w in summary.workers), default=0)
    fault_report(f"node {node} (the group's coordinator) killed while worker 0 was between "
                 f"produce and commit; coordination moved to node {moved}; "
                 f"{aborted} transactions aborted, {conflicts} marker conflicts, the slowest "
                 f"commit {slowest} ms, {_stats(summary, 'released_lock_deadline')}; lag {lag}")
    assert lag == 0, f"records left in the group: {summary}"
    try:
        _check_outputs(cluster_broker, out, dlq, keys, poison)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n{_missing(cluster_broker, out, dlq, keys - poison, summary)}") from exc


_COUNTERS = ("transactions", "transactions_aborted", "txn_commit_max_ms",
             "released_lock_deadline", "received", "accepted", "marker_overlaps_aborted",
             "exhausted", "dead_lettered", "produce_failures", "last_delivery_archived",
             "ack_failures", "released_marker_wait", "already_committed")


def _missing(kafka: LocalKafka, out: str, dlq: str, expected: set[Key],
             summary: WorkerSummary) -> str:
    """What a failed output check saw, to tell outputs lost from outputs a ``read_committed``
    reader did not reach yet (a transaction left open holds its last stable offset back):
    the origins missing, how many of them a ``read_uncommitted`` reader finds (copies of
    aborted or still open transactions), how many are still missing 60 s later (past the
    transaction timeout, the lock budget, and the coordinator's 10 s scan for timed-out
    transactions), those among the dead letters with their error, and the workers'
    counters. (2026-11-27 this test failed in 2 of 4 runs,
    lag 0 and 60-76 origins of partition 0 missing, without these figures.)"""
    def committed() -> set[Key]:
        return set(output_origins(read_topic(kafka, out, len(expected), settle_s=1.0)))

    missing = expected - committed()
    uncommitted = set(output_origins(read_topic(kafka, out, len(expected), settle_s=3.0,
                                                isolation="read_uncommitted")))
    later, deadline = missing, time.monotonic() + 60
    while later and time.monotonic() < deadline:
        time.sleep(5)
        later = expected - committed()
    workers = [{k: w.get(k, 0) for k in ("worker", "attempt", *_COUNTERS)}
               for w in summary.workers]
    dead = {output_origins([m])[0]: dict(m.headers() or []).get("kafka-share.error")
            for m in read_topic(kafka, dlq, 0, settle_s=1.0)}
    return (f"{len(missing)} origins missing for read_committed (e.g. {sorted(missing)[:3]}), "
            f"{len(missing & uncommitted)} of them in the log for read_uncommitted, "
            f"{len(later)} still missing 60 s later, dead-lettered: "
            f"{ {k: dead[k] for k in sorted(missing) if k in dead} }; workers: {workers}")


def _check_outputs(kafka: LocalKafka, out: str, dlq: str, keys: set[Key],
                   poison: set[Key]) -> None:
    """A ``read_committed`` reader sees each origin once: the poison ones among the dead
    letters, the others among the outputs."""
    outputs = read_topic(kafka, out, len(keys - poison), settle_s=1.0)
    dead = read_topic(kafka, dlq, len(poison), settle_s=1.0)
    assert_exactly_once(output_origins(outputs), keys - poison)
    assert_exactly_once(output_origins(dead), poison)


def _processed(job: WorkerJob) -> int:
    return sum(int(w.get("processed", 0)) for w in job.progress().workers.values())


def _stats(summary: WorkerSummary, *keys: str) -> dict[str, int]:
    return {k: sum(int(w.get(k, 0)) for w in summary.workers) for k in keys}


def test_workers_exactly_once_outputs_through_latency_resets_and_a_slow_drip_on_a_leaders_link(
    spark: SparkSession, kafka_cluster: LocalKafkaCluster, cluster_broker: LocalKafka,
    toxiproxy: Toxiproxy, cluster_topic_factory: ClusterTopicFactory, cluster_group: str,
    fault_report: Callable[[str], None],
) -> None:
    """A producer writes 40 records a second to 2 partitions while 2 workers with exactly-once
    outputs process them; source partition 0's leader's client link gets 500 ms of latency
    each way, then connections reset 300 ms into their responses, then a slow drip."""
    src, out, dlq = (cluster_topic_factory(n) for n in (2, 1, 1))
    kafka_cluster.set_group_config(cluster_group, "share.record.lock.duration.ms", 12_000)
    producer = SteadyProducer(kafka_cluster.bootstrap_servers, src, 2, 40.0, 1)
    job = start_workers(spark, _work, topics=src, group=cluster_group,
                        bootstrap_servers=kafka_cluster.bootstrap_servers, workers=2,
                        chunk_size=5, output_topic=out, dead_letter_topic=dlq,
                        exactly_once_outputs=True, on_progress=False, broker_timeout_s=60)
    with _producing(job, producer):
        wait_for(lambda: _processed(job), lambda n: n >= 40, 180, "the workers processing")
        node = kafka_cluster.leader(src, 0)
        hits = run_network_faults(toxiproxy, kafka_cluster.proxy_name(node),
                                  lambda: _processed(job))
    summary = stop_when_drained(job, cluster_broker, cluster_group, 300)
    stats = _stats(summary, "transactions", "transactions_aborted", "ack_failures",
                   "marker_conflicts")
    check_hits(hits, f"node {node} (leader of {src}-0)",
               f"{len(producer.delivered)} records produced; workers: {stats}", producer.errors,
               fault_report)
    keys = {(src, p, o) for p, o in producer.delivered.values()}
    poison = {(src, p, o) for v, (p, o) in producer.delivered.items() if v % 7 == 0}
    _check_outputs(cluster_broker, out, dlq, keys, poison)


def _freezes_once(frozen: str, after: int) -> Callable[[Record], Result]:
    """The worker function of :func:`_work` (20 ms a record): the first worker whose first
    attempt makes its ``after``-th call writes ``"<pid> <worker>"`` to ``frozen`` and SIGSTOPs
    its own Python worker (mid-chunk, holding the poll's records), once; it goes on where it
    stopped when SIGCONTed."""
    calls = [0]

    def work(rec: Record) -> Result:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        calls[0] += 1
        if ctx.attemptNumber() == 0 and calls[0] == after:
            try:  # the first worker to get here freezes, once
                fd = os.open(frozen, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, f"{os.getpid()} {ctx.partitionId()}".encode())
                os.close(fd)
                os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(0.02)
        return _work(rec)

    return work


def _words(path: str) -> list[str]:
    return Path(path).read_text().split() if Path(path).exists() else []


def _state(pid: int) -> str:
    """The process's state letter (T: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.brokers_ci
def test_a_worker_sigstopped_past_its_lock_resumes_and_duplicates_nothing(
    spark: SparkSession, kafka_cluster: LocalKafkaCluster, cluster_broker: LocalKafka,
    cluster_topic_factory: ClusterTopicFactory, cluster_group: str, tmp_path: Path,
    fault_report: Callable[[str], None],
) -> None:
    """A worker's Python worker is frozen (SIGSTOP: its share consumer's heartbeats stop too)
    mid-chunk; the test keeps it frozen until the other has drained the group (lag 0: the
    frozen worker's records came back when its session or locks expired), then SIGCONTs it.
    The zombie finishes its chunk, finds its deadline passed and aborts its transaction, its
    acknowledgements of records it no longer holds fail without failing the worker, and it
    polls on; each origin once for a ``read_committed`` reader."""
    src, out, dlq = (cluster_topic_factory(n) for n in (2, 1, 1))
    kafka_cluster.set_group_config(cluster_group, "share.record.lock.duration.ms", 8_000)
    n = 400  # 20 ms a record: seconds of work for each worker
    produce_spread(cluster_broker, src, 2, n)
    keys = spread_keys(src, 2, n)
    poison = {(src, i % 2, i // 2) for i in range(n) if _poison(b"v%d" % i)}
    frozen = str(tmp_path / "frozen")
    job = start_workers(spark, _freezes_once(frozen, 12), topics=src, group=cluster_group,
                        bootstrap_servers=kafka_cluster.bootstrap_servers, workers=2,
                        chunk_size=5, output_topic=out, dead_letter_topic=dlq,
                        exactly_once_outputs=True, on_progress=False, broker_timeout_s=60)
    pid = 0
    try:
        words = wait_for(lambda: _words(frozen), lambda w: len(w) == 2, 180, "a worker frozen")
        pid, victim = int(words[0]), int(words[1])
        wait_for(lambda: _state(pid), lambda s: s == "T", 30, f"pid {pid} stopped")
        frozen_at = time.monotonic()
        before = dict(job.progress().workers.get(victim, {}))
        assert before.get("pid") in (None, pid), f"pid {pid} is not worker {victim}'s: {before}"
        wait_for(lambda: group_lag(cluster_broker, cluster_group), lambda lag: lag == 0, 300,
                 f"the other worker drained the group while worker {victim} is frozen")
        assert _state(pid) == "T", f"worker {victim} woke up before the group was drained"
        frozen_s = time.monotonic() - frozen_at
        os.kill(pid, signal.SIGCONT)
        wait_for(lambda: job.progress().workers.get(victim, {}),
                 lambda w: int(w.get("polls", 0)) > int(before.get("polls", 0))
                 and int(w.get("transactions_aborted", 0)) >= 1, 120,
                 f"worker {victim} resumed, aborted its transaction and polled again")
    except BaseException:
        if pid:
            os.kill(pid, signal.SIGCONT)
        job.stop("the test failed", grace_s=60)
        raise
    summary = stop_when_drained(job, cluster_broker, cluster_group, 120)
    zombie = next(w for w in summary.workers if w["worker"] == victim)
    fault_report(f"worker {victim} (pid {pid}) frozen {frozen_s:.0f}s at its 12th call, after "
                 f"{before.get('processed', 0)} processed; resumed: aborted "
                 f"{zombie.get('transactions_aborted', 0)} transaction(s), "
                 f"{zombie.get('ack_failures', 0)} acknowledgement failures, released at the "
                 f"lock deadline {zombie.get('released_lock_deadline', 0)}, stop reason "
                 f"{zombie.get('stop_reason')!r}; all workers: "
                 f"{_stats(summary, 'transactions', 'transactions_aborted', 'marker_conflicts')}")
    assert not summary.failed_attempts, f"the zombie failed instead of going on:\n{summary}"
    assert all(w["attempt"] == 0 for w in summary.workers if w["worker"] == victim), \
        f"worker {victim} was retried, not resumed:\n{summary}"
    _check_outputs(cluster_broker, out, dlq, keys, poison)


@pytest.mark.parametrize(("client", "exactly_once"), [
    ("librdkafka", True), ("native", True), ("native", False)],
    ids=["librdkafka-exactly-once", "native-exactly-once", "native-at-least-once"])
def test_workers_outputs_through_leader_moves_with_every_commit_delayed(
    spark: SparkSession, kafka_cluster: LocalKafkaCluster, cluster_broker: LocalKafka,
    cluster_topic_factory: ClusterTopicFactory, cluster_group: str,
    fault_report: Callable[[str], None], client: ShareClient, exactly_once: bool,
) -> None:
    """A source partition's leader moving while a worker sits between its produce and its
    commit, its producer and marker reader talking to other brokers: the acquisitions are
    dropped with nobody told, and the records handed to the other worker. Every transaction of
    both workers waits 1 s before its commit check (chunks of 10, one a transaction) while the
    leader of each source partition in turn is restarted cleanly (its leaderships handed to a
    follower), four times, under a producer writing 6 records a second. Exactly once, with
    either client: nothing lost, nothing twice. Before the commit check read the markers since
    the barrier (issue 37), the first run, 2026-11-27, output 4 of 825 origins twice with
    ``marker_conflicts`` 0; such overlaps now abort (``marker_overlaps_aborted``, reported;
    docs/design.md), and the native client's check also RENEWs the transaction's records. At
    least once (native): the same moves (no commit to delay: the fault point is the
    transactions'), nothing lost; duplicates reported."""
    src, out, dlq = (cluster_topic_factory(n) for n in (2, 1, 1))
    kafka_cluster.set_group_config(cluster_group, "share.record.lock.duration.ms", 12_000)
    producer = SteadyProducer(kafka_cluster.bootstrap_servers, src, 2, 6.0, 1)
    job = start_workers(spark, _work, topics=src, group=cluster_group, client=client,
                        bootstrap_servers=kafka_cluster.bootstrap_servers, workers=2,
                        chunk_size=10, output_topic=out, dead_letter_topic=dlq,
                        exactly_once_outputs=exactly_once, on_progress=False,
                        broker_timeout_s=60, transaction_interval_s=0,
                        **worker_faults("sleep-before-commit:ms=1000"))
    moves = []
    with _producing(job, producer):
        wait_for(lambda: _processed(job), lambda n: n >= 20, 180, "the workers processing")
        for i in range(4):
            leader, at = kafka_cluster.leader(src, i % 2), _processed(job)
            kafka_cluster.restart(leader)
            moves.append(f"{src}-{i % 2}: node {leader} restarted at {at} processed, the "
                         f"leader is node {kafka_cluster.leader(src, i % 2)} now")
            wait_for(lambda: _processed(job), more_than(at), 180,
                     "the workers processing after the move")
    summary = stop_when_drained(job, cluster_broker, cluster_group, 300)
    stats = _stats(summary, "transactions", "transactions_aborted", "marker_conflicts",
                   "marker_overlaps_aborted")
    keys = {(src, p, o) for p, o in producer.delivered.values()}
    poison = {(src, p, o) for v, (p, o) in producer.delivered.items() if v % 7 == 0}
    got = output_origins(read_topic(cluster_broker, out, len(keys - poison), settle_s=1.0)) \
        + output_origins(read_topic(cluster_broker, dlq, len(poison), settle_s=1.0))
    twice = [k for k, c in Counter(got).items() if c > 1]
    fault_report(f"{'; '.join(moves)}; {len(keys)} records, {len(twice)} output twice; "
                 f"workers: {stats}")
    assert not keys - set(got), f"lost: {sorted(keys - set(got))[:5]}"
    assert set(got) == keys, f"outputs of records never produced: {sorted(set(got) - keys)[:5]}"
    if exactly_once:
        assert not twice, f"output twice: {sorted(twice)[:10]}; workers: {stats}"
