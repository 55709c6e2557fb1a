"""The driver's metrics of its queue workers and of its queries, rendered without Spark or a
broker: reports (as a :class:`WorkerJob` keeps them) and progresses (as PySpark gives them) in,
a scrape of the real HTTP server out. The real jobs are scraped in
tests/integration/test_exporter.py and tests/connect/."""

from __future__ import annotations

import json
import types
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pyspark_kafka_share.errors import WorkerJobError
from pyspark_kafka_share.exporter.query import QueryMetrics, _Poller
from pyspark_kafka_share.exporter.workers import (
    WORKER_METRIC_NAMES,
    WorkerMetrics,
    serve_worker_metrics,
)
from pyspark_kafka_share.workers.api import COUNTERS, WorkerJob, WorkerSummary, _totals
from pyspark_kafka_share.workers.config import WorkerConfig, WorkerSpec
from pyspark_kafka_share.workers.control import Endpoint
from pyspark_kafka_share.workers.control_state import ControlState
from tests.unit.test_workers_job import BASE, _Spark

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class FakeJob:
    """What the metrics read of a WorkerJob: its group, done, failure and reports."""

    def __init__(self, group: str = "scorers") -> None:
        self.group = group
        self.done = False
        self.failure: dict[str, Any] | None = None
        self.attempts: dict[tuple[int, int], dict[str, Any]] = {}

    def reports(self) -> dict[tuple[int, int], dict[str, Any]]:
        return {k: dict(v) for k, v in self.attempts.items()}


def _report(worker: int, attempt: int, state: str = "running", **counts: Any) -> dict[str, Any]:
    return {"worker": worker, "attempt": attempt, "state": state, "idle_s": 0.5,
            "failures": {}, "failure": None, **dict.fromkeys(COUNTERS, 0), **counts}


def _scrape(server: ThreadingHTTPServer) -> Samples:
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _w(worker: int, group: str = "scorers") -> tuple[tuple[str, str], ...]:
    return (("group", group), ("worker", str(worker)))


@pytest.fixture
def served() -> Iterator[tuple[FakeJob, ThreadingHTTPServer, WorkerMetrics]]:
    job = FakeJob()
    server, metrics = serve_worker_metrics(job, 0, "127.0.0.1")
    try:
        yield job, server, metrics
    finally:
        server.shutdown()
        server.server_close()


def test_counters_sum_every_attempt_and_gauges_read_the_newest(
        served: tuple[FakeJob, ThreadingHTTPServer, WorkerMetrics]) -> None:
    job, server, _ = served
    job.attempts = {
        (0, 0): _report(0, 0, received=12, processed=10, accepted=8, released=1, rejected=1,
                        dead_lettered=1, exhausted=1, marker_wait_ms=1500,
                        failures={"ValueError": 2}),
        # worker 1's first attempt died (its last report), its retry runs
        (1, 0): _report(1, 0, "lost", received=5, processed=5, accepted=5),
        (1, 1): _report(1, 1, received=7, processed=4, accepted=3, released=1, idle_s=3.25,
                        failures={"ValueError": 1, "KeyError": 4}),
    }
    s = _scrape(server)
    assert s[("kafka_share_workers_processed_total", _w(0))] == 10
    assert s[("kafka_share_workers_processed_total", _w(1))] == 5 + 4
    assert s[("kafka_share_workers_accepted_total", _w(1))] == 8
    assert s[("kafka_share_workers_dead_lettered_total", _w(0))] == 1
    assert s[("kafka_share_workers_exhausted_total", _w(0))] == 1
    assert s[("kafka_share_workers_marker_wait_seconds_total", _w(0))] == 1.5
    # in flight: received - (accepted + released + rejected + ack_failures) of the newest
    assert s[("kafka_share_workers_in_flight", _w(0))] == 12 - 10
    assert s[("kafka_share_workers_in_flight", _w(1))] == 7 - 4
    assert s[("kafka_share_workers_idle_seconds", _w(1))] == 3.25
    assert s[("kafka_share_workers_attempt", _w(1))] == 1
    assert s[("kafka_share_workers_running", (("group", "scorers"),))] == 2
    assert s[("kafka_share_workers_job_active", (("group", "scorers"),))] == 1
    failures = {labels: v for (name, labels), v in s.items()
                if name == "kafka_share_workers_failures_total"}
    assert failures == {(("group", "scorers"), ("type", "ValueError"), ("worker", "0")): 2,
                        (("group", "scorers"), ("type", "KeyError"), ("worker", "1")): 4,
                        (("group", "scorers"), ("type", "ValueError"), ("worker", "1")): 1}
    assert not any(name == "kafka_share_workers_job_failed" for name, _ in s)
    # every name served is one the docs and the dashboard may use, and each counter is there
    names = {name for name, _ in s}
    assert names <= set(WORKER_METRIC_NAMES)
    assert {n for n in WORKER_METRIC_NAMES if n != "kafka_share_workers_job_failed"} <= names


def test_a_phase_is_served_as_a_sum_and_as_its_longest_over_the_attempts(
        served: tuple[FakeJob, ThreadingHTTPServer, WorkerMetrics]) -> None:
    job, server, _ = served
    job.attempts = {(0, 0): _report(0, 0, "lost", txn_commit_ms=900, txn_commit_max_ms=700),
                    (0, 1): _report(0, 1, txn_commit_ms=300, txn_commit_max_ms=40)}
    s = _scrape(server)
    assert s[("kafka_share_workers_txn_commit_seconds_total", _w(0))] == 1.2  # summed
    assert s[("kafka_share_workers_txn_commit_max_seconds", _w(0))] == 0.7  # the largest
    totals = _totals(list(job.reports().values()))
    assert (totals["txn_commit_ms"], totals["txn_commit_max_ms"]) == (1200, 700)


def test_a_breaker_trip_then_the_end_of_the_job(
        served: tuple[FakeJob, ThreadingHTTPServer, WorkerMetrics]) -> None:
    job, server, _ = served
    job.attempts = {(0, 0): _report(0, 0, received=3, processed=3, accepted=3)}
    before = _scrape(server)[("kafka_share_workers_processed_total", _w(0))]
    job.failure = {"kind": "breaker", "message": "tripped", "option": None}
    job.attempts = {(0, 0): _report(0, 0, "stopped", received=9, processed=9, accepted=4,
                                    released=5)}
    job.done = True
    s = _scrape(server)
    assert s[("kafka_share_workers_processed_total", _w(0))] == 9 > before
    assert s[("kafka_share_workers_job_failed", (("group", "scorers"), ("kind", "breaker")))] == 1
    assert s[("kafka_share_workers_job_active", (("group", "scorers"),))] == 0
    assert s[("kafka_share_workers_running", (("group", "scorers"),))] == 0
    assert s[("kafka_share_workers_in_flight", _w(0))] == 0  # a stopped attempt holds none


def test_one_running_job_per_group(
        served: tuple[FakeJob, ThreadingHTTPServer, WorkerMetrics]) -> None:
    job, server, metrics = served
    with pytest.raises(ValueError, match="scorers"):
        metrics.add(FakeJob("scorers"))
    other = FakeJob("orders")
    other.attempts = {(0, 0): _report(0, 0, processed=2)}
    metrics.add(other)
    job.done = True
    again = FakeJob("scorers")  # the ended job of that group is replaced
    metrics.add(again)
    s = _scrape(server)
    assert s[("kafka_share_workers_processed_total", _w(0, "orders"))] == 2
    assert s[("kafka_share_workers_job_active", (("group", "scorers"),))] == 1


class _State(ControlState):
    """The driver's real report state as the job's channel (no transport)."""

    endpoint = Endpoint("127.0.0.1", 1, "token")

    def close(self) -> None:
        return None


def test_a_worker_job_serves_its_reports_and_a_worker_s_mistake() -> None:
    """The real WorkerJob's group, reports and failure, as the metrics read them."""
    state, spark = _State(), _Spark()
    config = WorkerConfig.create(**BASE, workers=2)
    job = WorkerJob(spark, WorkerSpec(config=config, lock_ms=30_000, delivery_limit=5),
                    lambda record: None, server=state, on_progress=None)
    server, _ = serve_worker_metrics(job, 0, "127.0.0.1")
    try:
        state.update(_report(0, 0, received=4, processed=4, accepted=4))
        state.update(_report(1, 0, received=2, processed=1, accepted=1))
        s = _scrape(server)
        assert s[("kafka_share_workers_processed_total", _w(0, "g"))] == 4
        assert s[("kafka_share_workers_in_flight", _w(1, "g"))] == 1
        assert s[("kafka_share_workers_job_active", (("group", "g"),))] == 1
        state.update(_report(1, 0, received=2, processed=2, accepted=1,
                             failure={"kind": "mistake", "message": "no output_topic",
                                      "option": "output_topic"}))
        s = _scrape(server)
        assert s[("kafka_share_workers_job_failed", (("group", "g"), ("kind", "mistake")))] == 1
        assert job.progress().totals["processed"] == 6  # the same reports progress sums
        spark.job.release.set()
        with pytest.raises(WorkerJobError):
            job.wait(30)
        assert _scrape(server)[("kafka_share_workers_job_active", (("group", "g"),))] == 0
    finally:
        spark.job.release.set()
        server.shutdown()
        server.server_close()


# ---- the query metrics: the poller (Spark Connect) and a terminated query ------------------

@dataclass(frozen=True)
class Progress:
    """A StreamingQueryProgress as PySpark gives it (the fields the metrics read)."""

    batchId: int  # PySpark's names
    numInputRows: int
    timestamp: str
    json: str


def _progress(batch: int, rows: int, lag: int, counted: int, records: int) -> Progress:
    report = {"lag": lag, "lagByPartition": {"orders:0": lag},
              "lastBatch": {"batch": counted, "records": records, "accepted": records}}
    stamp = f"2026-11-27T18:00:{batch:02d}.000Z"
    data = {"batchId": batch, "timestamp": stamp, "numInputRows": rows, "name": "q",
            "id": "id-1", "sources": [{"numInputRows": rows, "latestOffset": json.dumps(report)}]}
    return Progress(batch, rows, stamp, json.dumps(data))


class FakeQuery:
    def __init__(self) -> None:
        self.id, self.name = "id-1", "q"
        self.recentProgress: list[Progress] = []


class FakeStreams:
    def __init__(self) -> None:
        self.active: list[FakeQuery] = []


def _query_samples(metrics: QueryMetrics) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in metrics.collect() for s in fam.samples}


def test_the_poller_counts_each_progress_once_and_a_stopped_query_has_no_lag() -> None:
    streams, query = FakeStreams(), FakeQuery()
    metrics = QueryMetrics(streams)
    poller = _Poller(metrics, streams, 60.0)  # driven by hand: poll_once
    streams.active = [query]
    query.recentProgress = [_progress(0, 100, 400, 0, 0), _progress(1, 100, 300, 1, 100)]
    poller.poll_once()
    query.recentProgress.append(_progress(2, 50, 250, 2, 50))
    poller.poll_once()  # batches 0 and 1 again: not counted twice
    q = (("query", "q"),)
    s = _query_samples(metrics)
    assert s[("kafka_share_query_input_rows_total", q)] == 250
    assert s[("kafka_share_query_batch_records_total", q)] == 150
    assert s[("kafka_share_query_lag", q)] == 250 and s[("kafka_share_query_active", q)] == 1
    # The query stops after one more batch (its last report: the lag before that batch).
    query.recentProgress.append(_progress(3, 250, 250, 3, 250))
    streams.active = []
    poller.poll_once()
    s = _query_samples(metrics)
    assert s[("kafka_share_query_input_rows_total", q)] == 500
    assert s[("kafka_share_query_batch_records_total", q)] == 400
    assert s[("kafka_share_query_active", q)] == 0
    assert ("kafka_share_query_lag", q) not in s, "a stopped query's stale lag is not served"
    assert not any(name == "kafka_share_query_partition_lag" for name, _ in s)


def test_the_listener_s_terminated_query_keeps_its_counters_not_its_lag() -> None:
    metrics = QueryMetrics()
    started = types.SimpleNamespace(id="id-1", name="q")
    metrics.onQueryStarted(started)
    progress = _progress(4, 10, 41000, 3, 10)
    metrics.onQueryProgress(types.SimpleNamespace(progress=types.SimpleNamespace(
        name="q", id="id-1", json=progress.json, batchId=4, numInputRows=10)))
    q = (("query", "q"),)
    assert _query_samples(metrics)[("kafka_share_query_lag", q)] == 41000
    metrics.onQueryTerminated(started)
    s = _query_samples(metrics)
    assert ("kafka_share_query_lag", q) not in s  # the report's lag: from before the batch
    assert s[("kafka_share_query_batch_records_total", q)] == 10
    assert s[("kafka_share_query_active", q)] == 0


def test_the_summary_says_where_the_time_went() -> None:
    totals = _totals([{"function_ms": 41_200, "function_max_ms": 1_020, "txn_commit_ms": 300,
                       "txn_commit_max_ms": 40}, {"function_ms": 800, "function_max_ms": 90}])
    text = str(WorkerSummary(1.0, "idle timeout", totals))
    assert ("  time per phase, all workers: function 42.0s (max 1.02s), "
            "txn_commit 0.3s (max 0.04s)") in text.splitlines()
    assert "time per phase" not in str(WorkerSummary(1.0, "idle timeout", _totals([{}])))
