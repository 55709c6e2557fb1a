"""A driver's own ``/metrics`` for its queue workers: each scrape reads every attempt's latest
report from the running :class:`~pyspark_kafka_share.workers.WorkerJob` (what its progress
and summary sum; the driver has them in memory, so a scrape never waits for Spark or Kafka)
and serves them with prometheus_client, labelled by share group and worker index::

    from pyspark_kafka_share.exporter.workers import serve_worker_metrics
    job = start_workers(spark, fn, group="scorers", ...)   # classic or Spark Connect
    server, metrics = serve_worker_metrics(job, port=9466)
    summary = job.wait()
    server.shutdown()

A worker's counters are summed over its attempts (a retried task's dead attempt keeps its last
report), so they only grow while the job runs; after it ends they stay at the summary's totals
with ``kafka_share_workers_job_active`` 0 until the server is shut down.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from http.server import ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from pyspark_kafka_share.exporter.serve import serve_registry
from pyspark_kafka_share.workers.api import COUNTERS
from pyspark_kafka_share.workers.mistakes import unsettled
from pyspark_kafka_share.workers.phases import MAXIMA

__all__ = ["WORKER_METRICS", "WORKER_METRIC_NAMES", "WorkerMetrics", "serve_worker_metrics"]

_WORKER = ("group", "worker")
def _in_ms(key: str) -> bool:
    """A counter the workers keep in milliseconds (``*_ms``), served in seconds."""
    return key.endswith("_ms")


def _counter_name(key: str) -> str:
    return f"kafka_share_workers_{key.removesuffix('_ms') + '_seconds' if _in_ms(key) else key}"


WORKER_METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "kafka_share_workers_job_active": ("gauge", ("group",), "1 while the worker job runs, 0 "
                                       "once it ended"),
    "kafka_share_workers_job_failed": ("gauge", ("group", "kind"), "1 once the job stops for "
                                       "a failure (kind: mistake, a configuration mistake; "
                                       "breaker, the circuit breaker tripped)"),
    "kafka_share_workers_running": ("gauge", ("group",), "Workers whose newest attempt runs"),
    "kafka_share_workers_attempt": ("gauge", _WORKER, "The worker's newest attempt (above 0: "
                                    "Spark retried its task)"),
    "kafka_share_workers_in_flight": ("gauge", _WORKER, "Records the worker's newest attempt "
                                      "received and had not settled at its last report"),
    "kafka_share_workers_idle_seconds": ("gauge", _WORKER, "Seconds since the worker's newest "
                                         "attempt last got a record"),
    "kafka_share_workers_failures": ("counter", ("group", "worker", "type"), "Records the "
                                     "function failed on, by exception type"),
    **{_counter_name(key): ("counter", _WORKER, f"The worker's {key} counter, every attempt's "
                            "summed (docs/workers.md)" + (" in seconds" if _in_ms(key)
                                                          else ""))
       for key in COUNTERS},
    **{_counter_name(key): ("gauge", _WORKER, f"The worker's {key.removesuffix('_max_ms')} "
                            "phase at its longest (one poll, call or transaction), in seconds, "
                            "the largest over its attempts (docs/workers.md)")
       for key in MAXIMA},
}
"""``{family: (type, labels, help)}`` of :class:`WorkerMetrics` (docs/operations.md)."""

WORKER_METRIC_NAMES = tuple(name + "_total" if kind == "counter" else name
                            for name, (kind, _, _) in WORKER_METRICS.items())
"""The sample names as a scraper sees them (counters with ``_total``)."""


class Reporting(Protocol):
    """What :class:`WorkerMetrics` reads of a :class:`~pyspark_kafka_share.workers.WorkerJob`."""

    @property
    def group(self) -> str: ...

    @property
    def done(self) -> bool: ...

    @property
    def failure(self) -> dict[str, Any] | None: ...

    def reports(self) -> dict[tuple[int, int], dict[str, Any]]: ...


def _int(value: object) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _in_flight(report: Mapping[str, Any]) -> int:
    """Received and not settled at the report (0 once the attempt stopped)."""
    return unsettled(report) if report.get("state") in ("running", "starting") else 0


class WorkerMetrics(Collector):
    """The collector: the reports of the jobs :meth:`add` ed, read at each scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, Reporting] = {}

    def add(self, job: Reporting) -> None:
        """Serve ``job`` (label ``group``: its share group); it replaces an ended job of the
        same group, and :class:`ValueError` if one of that group still runs."""
        with self._lock:
            old = self._jobs.get(job.group)
            if old is not None and old is not job and not old.done:
                raise ValueError(f"a worker job of group {job.group!r} is served already")
            self._jobs[job.group] = job

    def collect(self) -> Iterator[Metric]:
        fams: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            name: (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, doc, labels=labels) for name, (kind, labels, doc) in WORKER_METRICS.items()}
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            _add_job(fams, job.group, job.done, job.failure, job.reports())
        yield from fams.values()


def _add_job(fams: Mapping[str, GaugeMetricFamily | CounterMetricFamily], group: str,
             done: bool, failure: Mapping[str, Any] | None,
             reports: Mapping[tuple[int, int], Mapping[str, Any]]) -> None:
    fams["kafka_share_workers_job_active"].add_metric([group], 0 if done else 1)
    if failure is not None:
        fams["kafka_share_workers_job_failed"].add_metric(
            [group, str(failure.get("kind", "unknown"))], 1)
    newest: dict[int, Mapping[str, Any]] = {}
    totals: dict[int, dict[str, int]] = {}
    longest: dict[int, dict[str, int]] = {}
    failures: dict[tuple[int, str], int] = {}
    for (worker, _attempt), report in sorted(reports.items()):
        newest[worker] = report
        summed = totals.setdefault(worker, dict.fromkeys(COUNTERS, 0))
        for key in COUNTERS:
            summed[key] += _int(report.get(key))
        top = longest.setdefault(worker, dict.fromkeys(MAXIMA, 0))
        for key in MAXIMA:
            top[key] = max(top[key], _int(report.get(key)))
        raw = report.get("failures")
        for kind, count in (raw.items() if isinstance(raw, Mapping) else ()):
            failures[(worker, str(kind))] = failures.get((worker, str(kind)), 0) + _int(count)
    fams["kafka_share_workers_running"].add_metric(
        [group], sum(1 for r in newest.values() if r.get("state") == "running"))
    for worker, report in newest.items():
        labels = [group, str(worker)]
        fams["kafka_share_workers_attempt"].add_metric(labels, _int(report.get("attempt")))
        fams["kafka_share_workers_in_flight"].add_metric(labels, _in_flight(report))
        fams["kafka_share_workers_idle_seconds"].add_metric(labels,
                                                            float(report.get("idle_s") or 0))
        for key, total in (*totals[worker].items(), *longest[worker].items()):
            fams[_counter_name(key)].add_metric(
                labels, total / 1000 if _in_ms(key) else total)
    for (worker, kind), count in sorted(failures.items()):
        fams["kafka_share_workers_failures"].add_metric([group, str(worker), kind], count)


def serve_worker_metrics(job: Reporting, port: int, address: str = "0.0.0.0",
                         ) -> tuple[ThreadingHTTPServer, WorkerMetrics]:
    """Serve ``job``'s metrics on ``address:port`` (0: a free one) from a daemon thread, with
    the server of :func:`~pyspark_kafka_share.exporter.serve.serve_registry` (``/metrics``,
    ``/healthz``). Returns the server (``server.shutdown()`` stops it) and the collector
    (``metrics.add(other_job)`` serves another job there too). One port for the workers and
    the queries: register a :class:`WorkerMetrics` and the query metrics on one registry
    and serve it with ``serve_registry`` (docs/operations.md)."""
    collector = WorkerMetrics()
    collector.add(job)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return serve_registry(registry, address, port), collector
