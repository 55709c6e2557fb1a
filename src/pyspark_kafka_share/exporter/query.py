"""A driver's own ``/metrics`` for its ``kafka-share`` queries: a ``StreamingQueryListener``
reads each progress with :func:`pyspark_kafka_share.progress` and keeps the numbers per
query (label ``query``: the query's name, else its id), served with prometheus_client::

    from pyspark_kafka_share.exporter.query import serve_query_metrics
    server, listener = serve_query_metrics(spark, port=9465)  # before starting the queries
    ...
    server.shutdown(); spark.streams.removeListener(listener)

Counters add the source's last-batch counters once per source batch (``lastBatch["batch"]``),
so a report repeated by Spark is not counted twice. Classic sessions only: a Spark Connect
client gets its progress from ``query.lastProgress`` (not served here).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from pyspark.sql.streaming.listener import StreamingQueryListener

from pyspark_kafka_share.exporter.serve import serve_registry
from pyspark_kafka_share.query_progress import progress

__all__ = ["QUERY_METRICS", "QUERY_METRIC_NAMES", "QueryMetrics", "serve_query_metrics"]

_COUNTED = ("records", "accepted", "released", "duplicates_dropped", "records_lost",
            "commit_failures", "redelivered")
QUERY_METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "kafka_share_query_lag": ("gauge", ("query",), "The group's records not yet acknowledged "
                              "for good when the query's source last looked"),
    "kafka_share_query_partition_lag": ("gauge", ("query", "topic", "partition"),
                                        "The same per partition (absent while unknown)"),
    "kafka_share_query_batch_id": ("gauge", ("query",), "Spark's id of the last progress"),
    "kafka_share_query_input_rows": ("counter", ("query",), "Rows the query's batches read"),
    "kafka_share_query_active": ("gauge", ("query",), "1 while the query runs, 0 once it "
                                 "terminated"),
    **{f"kafka_share_query_batch_{name}": (
        "counter", ("query",), f"The source's batches' {name.replace('_', ' ')} (lastBatch)")
       for name in _COUNTED},
}
"""``{family: (type, labels, help)}`` of :class:`QueryMetrics` (docs/operations.md)."""

QUERY_METRIC_NAMES = tuple(name + "_total" if kind == "counter" else name
                           for name, (kind, _, _) in QUERY_METRICS.items())


@dataclass
class _Query:
    lag: int | None = None
    lag_by_partition: dict[str, int | None] = field(default_factory=dict)
    batch_id: int = -1
    input_rows: int = 0
    active: bool = True
    counted_batch: int | None = None
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_COUNTED, 0))


class QueryMetrics(StreamingQueryListener, Collector):
    """The listener and the collector: progress in, metric families out."""

    def __init__(self, streams: Any = None) -> None:
        self._streams = streams  # spark.streams: the last progress of an idle query
        self._lock = threading.Lock()
        self._queries: dict[str, _Query] = {}
        self._names: dict[str, str] = {}

    def onQueryStarted(self, event: Any) -> None:
        with self._lock:
            self._names[str(event.id)] = event.name or str(event.id)
            self._queries.setdefault(self._names[str(event.id)], _Query()).active = True

    def onQueryProgress(self, event: Any) -> None:
        p = event.progress
        self._update(p.name or str(p.id), p.json, int(p.batchId), int(p.numInputRows or 0))

    def onQueryIdle(self, event: Any) -> None:
        """Spark posts no progress event for a trigger without data (3.5+), but the query's
        last progress has the source's report of it (the lag, the last batch's counters)."""
        query = self._streams.get(str(event.id)) if self._streams is not None else None
        last = None if query is None else query.lastProgress
        if last is not None:
            self._update(last.name or str(last.id), last.json, int(last.batchId), 0)

    def _update(self, name: str, progress_json: str, batch_id: int, rows: int) -> None:
        report = progress(progress_json)
        with self._lock:
            q = self._queries.setdefault(name, _Query())
            q.batch_id = max(q.batch_id, batch_id)
            q.input_rows += rows
            if report is None:
                return
            q.lag, q.lag_by_partition = report.lag, dict(report.lag_by_partition)
            batch = report.last_batch.get("batch")
            if batch is not None and batch != q.counted_batch:
                q.counted_batch = batch
                for key in _COUNTED:
                    q.totals[key] += int(report.last_batch.get(key, 0))

    def onQueryTerminated(self, event: Any) -> None:
        with self._lock:
            name = self._names.get(str(event.id), str(event.id))
            self._queries.setdefault(name, _Query()).active = False

    def collect(self) -> Iterator[Metric]:
        fams: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            name: (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
                name, doc, labels=labels) for name, (kind, labels, doc) in QUERY_METRICS.items()}
        with self._lock:
            queries = {n: (q.lag, dict(q.lag_by_partition), q.batch_id, q.input_rows,
                           q.active, dict(q.totals)) for n, q in self._queries.items()}
        for name, (lag, by_partition, batch_id, rows, active, totals) in queries.items():
            if lag is not None:
                fams["kafka_share_query_lag"].add_metric([name], lag)
            for tp, value in by_partition.items():
                topic, _, part = tp.rpartition(":")
                if value is not None:
                    fams["kafka_share_query_partition_lag"].add_metric([name, topic, part], value)
            fams["kafka_share_query_batch_id"].add_metric([name], batch_id)
            fams["kafka_share_query_input_rows"].add_metric([name], rows)
            fams["kafka_share_query_active"].add_metric([name], 1 if active else 0)
            for key, total in totals.items():
                fams[f"kafka_share_query_batch_{key}"].add_metric([name], total)
        yield from fams.values()


def serve_query_metrics(spark: Any, port: int,
                        address: str = "0.0.0.0") -> tuple[ThreadingHTTPServer, QueryMetrics]:
    """Register a :class:`QueryMetrics` on ``spark``'s streams and serve it on
    ``address:port`` (0: a free one) from a daemon thread. Returns the server
    (``server.shutdown()`` stops it) and the listener (``spark.streams.removeListener``)."""
    listener = QueryMetrics(spark.streams)
    spark.streams.addListener(listener)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(listener)
    return serve_registry(registry, address, port), listener
