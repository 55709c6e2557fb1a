"""Queue workers (``run_workers``) on a Spark standalone cluster, one executor JVM killed mid-run.

One run serves the first two tests (module fixture ``killed_run``): two workers, one per
executor; the worker of Spark partition 0 blocks inside the function on its 31st call, the
driver receives its report of what it finished before, and the test SIGKILLs the executor JVM
running it. Spark retries the task on the replacement executor; the other worker takes the
records the dead one held (the broker hands them back when its connection closes).

A second run (``eos_killed_run``) does the same with ``exactly_once_outputs=True`` and a
dead-letter topic, and kills the executor where exactly-once matters most: worker 0 sits
after a transaction's commit and before its acknowledgement (the test-only fault point
``sleep-after-commit``), so the records it committed come back to a worker that must decide
them from the committed marker, without running the function or producing again.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share.admin import ShareGroupAdmin
from pyspark_kafka_share.harness import LocalKafka, LocalSparkCluster, ProducerRecord
from pyspark_kafka_share.harness.spark import ExecutorProcess
from pyspark_kafka_share.workers import (
    Record,
    Result,
    WorkerProgress,
    WorkerSummary,
    start_workers,
)
from tests.helpers import (
    Key,
    assert_exactly_once,
    assert_killed_attempt_lost,
    read_topic,
    retried_attempt,
    stop_when_drained,
    worker_faults,
)

pytestmark = pytest.mark.cluster

# The worker function runs on the executors, which cannot import this module: ship it by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

N = 600
CHUNK = 10
BLOCK_AFTER = 30  # the victim blocks on its 31st call


@dataclass
class KilledRun:
    summary: WorkerSummary
    calls: list[dict[str, Any]]
    killed: ExecutorProcess
    victim: int  # the Spark partition (worker index) whose executor was killed
    reported_before_kill: dict[str, Any]
    lag: int | None
    outputs: Counter[str]


def _calls(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _lag(kafka: LocalKafka, group: str, timeout_s: float = 30.0) -> int | None:
    """The group's total lag, once it is 0 (or the last value seen after ``timeout_s``)."""
    lag = None
    deadline = time.monotonic() + timeout_s
    with ShareGroupAdmin(kafka.bootstrap_servers) as admin:
        while time.monotonic() < deadline:
            lag = admin.total_lag(group)
            if lag == 0:
                break
            time.sleep(1)
    return lag


def _fresh(kafka: LocalKafka, name: str, records: int,
           *sinks: str) -> tuple[str, str, tuple[str, ...]]:
    """A new group reading from the earliest offset, a 2-partition source topic holding
    ``records`` records (``v<i>``, key ``k<i>``, small batches: spread over both partitions) and
    a 1-partition topic per name in ``sinks``: (group, source, sink topics)."""
    tag = uuid.uuid4().hex[:8]
    src = kafka.create_topic(f"{name}-in-{tag}", 2)
    topics = tuple(kafka.create_topic(f"{name}-{sink}-{tag}", 1) for sink in sinks)
    group = f"{name}-{tag}"
    kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
    kafka.produce(src, [ProducerRecord(value=f"v{i}".encode(), key=f"k{i}".encode())
                        for i in range(records)], producer_config={"batch.size": "800"})
    return group, src, topics


@pytest.fixture(scope="module")
def killed_run(cluster: LocalSparkCluster, cluster_spark: SparkSession, kafka: LocalKafka,
               tmp_path_factory: pytest.TempPathFactory) -> KilledRun:
    tmp = tmp_path_factory.mktemp("workers")
    group, src, (out,) = _fresh(kafka, "cluster-workers", N, "out")
    log = str(tmp / "calls.jsonl")
    blocked = str(tmp / "blocked")

    def work(rec: Record) -> bytes:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        me, attempt = ctx.partitionId(), ctx.attemptNumber()
        line = json.dumps({"key": (rec.key or b"").decode(), "dc": rec.delivery_count,
                           "worker": me, "attempt": attempt, "pid": os.getpid()})
        with open(log, "a") as f:
            f.write(line + "\n")
        mine = sum(1 for c in _calls(Path(log)) if c["worker"] == me and c["attempt"] == 0)
        if me == 0 and attempt == 0 and mine == BLOCK_AFTER + 1:
            with open(blocked, "w") as f:
                f.write(str(os.getpid()))
            time.sleep(600)  # until the test kills this executor
        time.sleep(0.03)
        return rec.value or b""

    state: dict[str, Any] = {}

    def on_progress(p: WorkerProgress) -> None:
        # Called by the driver's monitor thread every 0.5 s. Reports come every second: 2.5 s
        # after the victim blocked, the driver holds a report of what it finished before.
        if "killed" in state or not Path(blocked).exists():
            return
        state.setdefault("blocked_at", time.monotonic())
        report = state["last"] = dict(p.workers.get(0, {}))
        if time.monotonic() - state["blocked_at"] < 2.5 or report.get("attempt") != 0:
            return
        try:  # the monitor thread swallows exceptions: keep them for the assertion below
            pid = int(Path(blocked).read_text())
            executor = cluster.executor_of(pid)
            if executor is None:
                raise AssertionError(f"python worker {pid} runs under no executor JVM")
            state["report"] = dict(report)
            state["killed"] = cluster.kill_executor(executor.worker)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion after the run
            state.setdefault("errors", []).append(repr(exc))

    job = start_workers(cluster_spark, work, topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2,
                        chunk_size=CHUNK, output_topic=out,
                        on_progress=on_progress, progress_interval_s=0.5)
    # Done once the executor was killed, Spark's retry of the killed worker reported and every
    # record is acknowledged for good (not on a 15 s idle timeout, which the replacement
    # executor's start outlasts on a loaded machine).
    summary = stop_when_drained(job, kafka, group, timeout_s=600,
                                settled=lambda: "killed" in state and retried_attempt(job, 0))
    assert "killed" in state, (f"the executor was never killed (errors: {state.get('errors')}, "
                               f"worker 0's last report: {state.get('last')}); summary:\n{summary}")
    cluster.wait_for_executors(cluster_spark, timeout_s=120)  # the replacement
    outputs = Counter((m.value() or b"").decode()
                      for m in read_topic(kafka, out, N, timeout_s=60.0))
    return KilledRun(summary=summary, calls=_calls(Path(log)), killed=state["killed"], victim=0,
                     reported_before_kill=state["report"], lag=_lag(kafka, group),
                     outputs=outputs)


def _kill_evidence(evidence: Callable[[str], None], k: Any, summary: WorkerSummary,
                   what: str) -> None:
    """The tier report's lines: the executor killed (``what``: when), then the summary."""
    evidence(f"SIGKILLed executor {k.executor_id} (pid {k.pid}, worker {k.worker}, {k.host}) "
             + what)
    for line in str(summary).splitlines():
        evidence(line)


def test_killed_executor_loses_no_record(killed_run: KilledRun,
                                        evidence: Callable[[str], None]) -> None:
    run = killed_run
    _kill_evidence(evidence, run.killed, run.summary,
                   f"while its queue worker {run.victim} was blocked in the function; its last "
                   f"report: processed={run.reported_before_kill.get('processed')} "
                   f"accepted={run.reported_before_kill.get('accepted')}")
    # Nothing lost at the broker: every record was ACCEPTed (lag 0) ...
    assert run.lag == 0, f"the group's lag is {run.lag}, not 0"
    # ... and processed at least once, with its output produced.
    keys = Counter(c["key"] for c in run.calls)
    assert set(keys) == {f"k{i}" for i in range(N)}, \
        f"{N - len(set(keys))} records never reached the function"
    assert set(run.outputs) == {f"v{i}" for i in range(N)}
    # The dead worker's records came back (redelivered) and Spark retried its task.
    assert any(c["dc"] > 1 for c in run.calls), "no record was redelivered"
    final = {w["worker"]: w for w in run.summary.workers}
    assert final[run.victim]["attempt"] >= 1, "Spark did not retry the killed worker's task"
    evidence(f"{sum(1 for c in run.calls if c['dc'] > 1)} calls on redelivered records, "
             f"{sum(keys.values()) - N} records processed more than once; lag 0; all {N} "
             f"outputs on the output topic")


def _interrupted(run: KilledRun, lost: dict[str, Any]) -> int:
    """The calls a lost attempt made that its last report does not count."""
    calls = sum(1 for c in run.calls if (c["worker"], c["attempt"]) == (lost["worker"],
                                                                         lost["attempt"]))
    return calls - int(lost.get("processed", 0))


def test_the_summary_counts_the_killed_attempt(killed_run: KilledRun) -> None:
    # Issue 13: WorkerSummary counts every attempt.
    run = killed_run
    attempts = {(w["worker"], w["attempt"]) for w in run.summary.workers}
    # The killed attempt is in the summary, marked lost, with what it last reported ...
    assert (run.victim, 0) in attempts, f"the killed attempt is missing: {sorted(attempts)}"
    assert_killed_attempt_lost(run.summary, run.victim)  # not the exact list: see the helper
    killed = next(w for w in run.summary.workers
                  if (w["worker"], w["attempt"]) == (run.victim, 0))
    assert killed["processed"] == run.reported_before_kill["processed"]
    # ... so the totals count every record whose chunk finished: all calls but those of the
    # chunk the kill interrupted (its calls up to the blocked one), and of the chunk any other
    # lost attempt (a loaded machine's) was in.
    victim_calls = sum(1 for c in run.calls if (c["worker"], c["attempt"]) == (run.victim, 0))
    interrupted = victim_calls - killed["processed"]
    assert 1 <= interrupted <= CHUNK
    others = [_interrupted(run, w) for w in run.summary.failed_attempts
              if (w["worker"], w["attempt"]) != (run.victim, 0)]
    assert all(0 <= n <= CHUNK for n in others), others
    assert run.summary.totals["processed"] == len(run.calls) - interrupted - sum(others)
    # Every attempt that called the function has its entry.
    assert {(c["worker"], c["attempt"]) for c in run.calls} <= attempts


# -- exactly-once outputs: the executor killed between a commit and its acknowledgement ------

EOS_N = 400
EOS_KILL_AT = 2  # worker 0's transaction after whose commit it waits to be killed


def _poison(value: bytes) -> bool:
    return int(value[1:]) % 7 == 0


@dataclass
class EosKilledRun:
    summary: WorkerSummary
    killed: ExecutorProcess
    reported_before_kill: dict[str, Any]
    source: dict[Key, bytes]  # every input record: (topic, partition, offset) -> value
    outputs: list[tuple[Key, bytes]]  # read_committed: (origin, value)
    dead: list[Key]  # read_committed: origins of the dead letters
    uncommitted_outputs: int  # what a read_uncommitted reader sees in the output topic
    calls: Counter[str]  # function calls per input value
    lag: int | None
    took_s: float


def _origin(m: Message) -> Key:
    h = {k: (v.encode() if isinstance(v, str) else v or b"").decode()
         for k, v in dict(m.headers() or []).items()}
    return (h["kafka-share.origin.topic"], int(h["kafka-share.origin.partition"]),
            int(h["kafka-share.origin.offset"]))


def _kill_when_parked(cluster: LocalSparkCluster, state: dict[str, Any]) -> \
        Callable[[WorkerProgress], None]:
    """``on_progress``: once worker 0 (attempt 0) reports its ``EOS_KILL_AT``-th commit and
    then no progress for 2.5 s (it sits in the fault point), SIGKILL its executor."""

    def on_progress(p: WorkerProgress) -> None:
        if "killed" in state:
            return
        report = dict(p.workers.get(0, {}))
        if report.get("attempt") != 0 or report.get("transactions", 0) < EOS_KILL_AT:
            return
        first = state.setdefault("parked", (time.monotonic(), report.get("processed")))
        if time.monotonic() - first[0] < 2.5:
            return
        try:  # the monitor thread swallows exceptions: keep them for the assertion
            if report.get("processed") != first[1]:
                raise AssertionError(f"worker 0 went on after its commit: {first} {report}")
            executor = cluster.executor_of(int(report["pid"]))
            if executor is None:
                raise AssertionError(f"python worker {report['pid']} runs under no executor")
            state["report"] = report
            state["killed"] = cluster.kill_executor(executor.worker)
        except Exception as exc:  # noqa: BLE001 - reported by the assertion after the run
            state.setdefault("errors", []).append(repr(exc))
            state["killed"] = None

    return on_progress


@pytest.fixture(scope="module")
def eos_killed_run(cluster: LocalSparkCluster, cluster_spark: SparkSession, kafka: LocalKafka,
                   tmp_path_factory: pytest.TempPathFactory) -> EosKilledRun:
    started = time.monotonic()
    tmp = tmp_path_factory.mktemp("workers-eos")
    group, src, (out, dlq) = _fresh(kafka, "cluster-eos", EOS_N, "out", "dlq")
    source = {(m.topic() or "", m.partition() or 0, m.offset() or 0): m.value() or b""
              for m in read_topic(kafka, src, EOS_N, settle_s=0.5)}
    log = str(tmp / "calls.jsonl")

    def work(rec: Record) -> Result:
        with open(log, "a") as f:
            f.write(json.dumps({"value": (rec.value or b"").decode()}) + "\n")
        time.sleep(0.02)
        value = rec.value or b""
        return Result.reject("poison") if _poison(value) else Result.accept(value + b"-out")

    state: dict[str, Any] = {}
    job = start_workers(
        cluster_spark, work, topics=src, group=group, bootstrap_servers=kafka.bootstrap_servers,
        workers=2, chunk_size=CHUNK, output_topic=out, dead_letter_topic=dlq,
        exactly_once_outputs=True, on_progress=_kill_when_parked(cluster, state),
        progress_interval_s=0.5,
        **worker_faults(f"sleep-after-commit:part=0:attempt=0:seq={EOS_KILL_AT}:ms=600000"))
    # Done once the executor was killed, Spark's retry of the killed worker reported and every
    # record is acknowledged for good (not on a 15 s idle timeout, which the replacement
    # executor's start outlasts on a loaded machine).
    summary = stop_when_drained(job, kafka, group, timeout_s=600,
                                settled=lambda: "killed" in state and retried_attempt(job, 0))
    assert state.get("killed") is not None, (
        f"the executor was not killed (errors: {state.get('errors')}); summary:\n{summary}")
    cluster.wait_for_executors(cluster_spark, timeout_s=120)  # the replacement
    good = sum(1 for v in source.values() if not _poison(v))
    outputs = read_topic(kafka, out, good, timeout_s=60.0, settle_s=1.0)
    dead = read_topic(kafka, dlq, EOS_N - good, timeout_s=60.0, settle_s=1.0)
    seen = read_topic(kafka, out, good, settle_s=1.0, isolation="read_uncommitted")
    calls = Counter(json.loads(line)["value"] for line in Path(log).read_text().splitlines())
    return EosKilledRun(
        summary=summary, killed=state["killed"], reported_before_kill=state["report"],
        source=source, outputs=[(_origin(m), m.value() or b"") for m in outputs],
        dead=[_origin(m) for m in dead], uncommitted_outputs=len(seen), calls=calls,
        lag=_lag(kafka, group), took_s=time.monotonic() - started)


def test_exactly_once_outputs_survive_an_executor_killed_after_a_commit(
        eos_killed_run: EosKilledRun, evidence: Callable[[str], None]) -> None:
    run = eos_killed_run
    _kill_evidence(evidence, run.killed, run.summary,
                   f"while queue worker 0 (exactly_once_outputs) sat after its commit "
                   f"#{EOS_KILL_AT}, before the acknowledgement; its last report: "
                   f"{run.reported_before_kill.get('processed')} processed, "
                   f"{run.reported_before_kill.get('transactions')} transactions")
    poison = {key for key, v in run.source.items() if _poison(v)}
    # read_committed: every origin exactly once, in the output topic or the dead-letter topic.
    assert_exactly_once([key for key, _ in run.outputs], set(run.source) - poison)
    assert all(value == run.source[key] + b"-out" for key, value in run.outputs)
    assert_exactly_once(run.dead, poison)
    assert run.lag == 0, f"the group's lag is {run.lag}, not 0"
    # The committed records came back (the dead attempt never acknowledged them) and were
    # decided by the marker, not run again: no function call twice for them.
    t = run.summary.totals
    assert t["already_committed"] >= 1, str(run.summary.workers)
    assert t["transactions"] >= 2 * EOS_KILL_AT, str(t)
    assert set(run.calls) == {v.decode() for v in run.source.values()}
    evidence(f"read_committed: {len(run.outputs)} outputs and {len(run.dead)} dead letters, each "
             f"origin once; {t['already_committed']} records decided by a committed marker; "
             f"{sum(n - 1 for n in run.calls.values())} function calls repeated (a chunk the "
             f"kill interrupted); read_uncommitted sees {run.uncommitted_outputs} outputs; "
             f"lag 0; the run took {run.took_s:.0f}s")


def test_the_exactly_once_summary_counts_the_killed_attempt(
        eos_killed_run: EosKilledRun) -> None:
    run = eos_killed_run
    assert_killed_attempt_lost(run.summary, 0)  # not the exact list: see the helper
    killed = next(w for w in run.summary.workers if (w["worker"], w["attempt"]) == (0, 0))
    assert killed["transactions"] == run.reported_before_kill["transactions"] >= EOS_KILL_AT
    final = {w["worker"]: w for w in run.summary.workers}
    assert final[0]["attempt"] >= 1, "Spark did not retry the killed worker's task"
    # The totals count the dead attempt's transactions too.
    assert run.summary.totals["transactions"] == sum(
        int(w.get("transactions", 0)) for w in run.summary.workers)
