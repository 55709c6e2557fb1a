"""Queue workers (``run_workers``) on a Spark standalone cluster, one executor JVM killed mid-run.

One run serves both tests (module fixture ``killed_run``): two workers, one per executor; the
worker of Spark partition 0 blocks inside the function on its 31st call, the driver receives
its report of what it finished before, and the test SIGKILLs the executor JVM running it.
Spark retries the task on the replacement executor; the other worker takes the records the
dead one held (the broker hands them back when its connection closes).
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
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share.admin import ShareGroupAdmin
from pyspark_kafka_share.harness import LocalKafka, LocalSparkCluster, ProducerRecord
from pyspark_kafka_share.harness.spark import ExecutorProcess
from pyspark_kafka_share.workers import Record, WorkerProgress, WorkerSummary, run_workers
from tests.helpers import read_topic

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


@pytest.fixture(scope="module")
def killed_run(cluster: LocalSparkCluster, cluster_spark: SparkSession, kafka: LocalKafka,
               tmp_path_factory: pytest.TempPathFactory) -> KilledRun:
    tmp = tmp_path_factory.mktemp("workers")
    tag = uuid.uuid4().hex[:8]
    src = kafka.create_topic(f"cluster-workers-in-{tag}", 2)
    out = kafka.create_topic(f"cluster-workers-out-{tag}", 1)
    group = f"cluster-workers-{tag}"
    kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
    kafka.produce(src, [ProducerRecord(value=f"v{i}".encode(), key=f"k{i}".encode())
                        for i in range(N)], producer_config={"batch.size": "800"})
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

    summary = run_workers(cluster_spark, work, topics=src, group=group,
                          bootstrap_servers=kafka.bootstrap_servers, workers=2,
                          chunk_size=CHUNK, output_topic=out, idle_timeout_s=15,
                          on_progress=on_progress, progress_interval_s=0.5)
    assert "killed" in state, (f"the executor was never killed (errors: {state.get('errors')}, "
                               f"worker 0's last report: {state.get('last')}); summary:\n{summary}")
    cluster.wait_for_executors(cluster_spark, timeout_s=120)  # the replacement
    outputs = Counter((m.value() or b"").decode()
                      for m in read_topic(kafka, out, N, timeout_s=60.0))
    return KilledRun(summary=summary, calls=_calls(Path(log)), killed=state["killed"], victim=0,
                     reported_before_kill=state["report"], lag=_lag(kafka, group),
                     outputs=outputs)


def test_killed_executor_loses_no_record(killed_run: KilledRun,
                                        evidence: Callable[[str], None]) -> None:
    run = killed_run
    k = run.killed
    evidence(f"SIGKILLed executor {k.executor_id} (pid {k.pid}, worker {k.worker}, {k.host}) "
             f"while its queue worker {run.victim} was blocked in the function; its last report: "
             f"processed={run.reported_before_kill.get('processed')} "
             f"accepted={run.reported_before_kill.get('accepted')}")
    for line in str(run.summary).splitlines():
        evidence(line)
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


def test_the_summary_counts_the_killed_attempt(killed_run: KilledRun) -> None:
    # Issue 13: WorkerSummary counts every attempt.
    run = killed_run
    attempts = {(w["worker"], w["attempt"]) for w in run.summary.workers}
    # The killed attempt is in the summary, marked lost, with what it last reported ...
    assert (run.victim, 0) in attempts, f"the killed attempt is missing: {sorted(attempts)}"
    assert [(w["worker"], w["attempt"]) for w in run.summary.failed_attempts] == [(run.victim, 0)]
    killed = next(w for w in run.summary.workers
                  if (w["worker"], w["attempt"]) == (run.victim, 0))
    assert killed["processed"] == run.reported_before_kill["processed"]
    # ... so the totals count every record whose chunk finished: all calls but those of the
    # chunk the kill interrupted (its calls up to the blocked one).
    victim_calls = sum(1 for c in run.calls if (c["worker"], c["attempt"]) == (run.victim, 0))
    interrupted = victim_calls - killed["processed"]
    assert 1 <= interrupted <= CHUNK
    assert run.summary.totals["processed"] == len(run.calls) - interrupted
    # Every attempt that called the function has its entry.
    assert {(c["worker"], c["attempt"]) for c in run.calls} <= attempts
