"""A driver's own ``/metrics`` for its ``kafka-share`` queries: the numbers of each progress
(read with :func:`pyspark_kafka_share.progress`), kept per query (label ``query``: the
query's name, else its id), served with prometheus_client::

    from pyspark_kafka_share.exporter.query import serve_query_metrics
    server, metrics = serve_query_metrics(spark, port=9465)  # before starting the queries
    ...
    server.shutdown(); metrics.close()

On a classic session a ``StreamingQueryListener`` takes each progress. On a Spark Connect
session (or with ``poll_interval_s``) a thread polls the session's active queries'
``recentProgress`` instead: PySpark's Connect client drops its client-side listeners once a
Python data source runs (SPARK-59135, PySpark 4.3.0), and polling works on every line.

Counters add the source's last-batch counters once per source batch (``lastBatch["batch"]``),
so a report repeated by Spark is not counted twice. Once a query terminated its lag is no
longer served (``kafka_share_query_active`` 0): its last report's lag is from before its last
batch (docs/operations.md), a backlog an alert would see that is not there.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from pyspark.sql.streaming.listener import StreamingQueryListener

from pyspark_kafka_share.exporter.serve import serve_registry
from pyspark_kafka_share.query_progress import progress
from pyspark_kafka_share.workers.preflight import is_connect

__all__ = ["QUERY_METRICS", "QUERY_METRIC_NAMES", "QueryMetrics", "serve_query_metrics"]

_LOG = logging.getLogger("pyspark_kafka_share.exporter")

_COUNTED = ("records", "accepted", "released", "duplicates_dropped", "records_lost",
            "commit_failures", "redelivered")
QUERY_METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "kafka_share_query_lag": ("gauge", ("query",), "The group's records not yet acknowledged "
                              "for good when the query's source last looked (absent once "
                              "the query terminated)"),
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
    polled: set[tuple[int, str]] = field(default_factory=set)  # (batchId, timestamp) taken


class QueryMetrics(StreamingQueryListener, Collector):
    """The listener (or the poller's target) and the collector: progress in, metric
    families out."""

    def __init__(self, streams: Any = None) -> None:
        self._streams = streams  # spark.streams: the last progress of an idle query
        self._lock = threading.Lock()
        self._queries: dict[str, _Query] = {}
        self._names: dict[str, str] = {}
        self._listening = False
        self._poller: _Poller | None = None

    def listen(self) -> None:
        """Take each progress from a listener on the streams (a classic session)."""
        self._streams.addListener(self)
        self._listening = True

    def poll(self, interval_s: float) -> None:
        """Take each progress by polling the streams' active queries (any session)."""
        self._poller = _Poller(self, self._streams, interval_s)
        self._poller.start()

    def close(self) -> None:
        """Stop listening (or polling); what was collected is still served."""
        if self._poller is not None:
            self._poller.stop()
        if self._listening and self._streams is not None:
            self._listening = False
            self._streams.removeListener(self)

    def polled(self, query_id: str, name: str | None, progresses: Iterable[Any]) -> None:
        """The poller's path: each progress of ``progresses`` (a query's ``recentProgress``)
        not taken before, in order."""
        name = name or query_id
        with self._lock:
            self._names[query_id] = name
            q = self._queries.setdefault(name, _Query())
            q.active = True
        for p in progresses:
            key = (int(p.batchId), str(p.timestamp))
            with self._lock:
                if key in q.polled:
                    continue
                q.polled.add(key)
                if len(q.polled) > 1000:  # recentProgress keeps the last 100
                    q.polled = set(sorted(q.polled)[-500:])
            self._update(name, p.json, int(p.batchId), int(p.numInputRows or 0))

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
        self.terminated(str(event.id))

    def terminated(self, query_id: str) -> None:
        """The query stopped: inactive, and its lag (from before its last batch) unknown."""
        with self._lock:
            q = self._queries.setdefault(self._names.get(query_id, query_id), _Query())
            q.active, q.lag, q.lag_by_partition = False, None, {}

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


class _Poller:
    """Reads the session's active queries' ``recentProgress`` every ``interval_s`` seconds
    into ``metrics``; a query gone from ``streams.active`` is read once more, then marked
    terminated. Errors (a Connect server away) are logged once and retried next time."""

    def __init__(self, metrics: QueryMetrics, streams: Any, interval_s: float) -> None:
        self._metrics, self._streams, self.interval_s = metrics, streams, interval_s
        self._known: dict[str, Any] = {}  # query id -> the StreamingQuery last seen active
        self._stop = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._loop, name="kafka-share-query-metrics",
                                        daemon=True)

    def poll_once(self) -> None:
        active = {str(q.id): q for q in self._streams.active}
        for query_id, query in {**self._known, **active}.items():
            if query_id in active:
                self._metrics.polled(query_id, query.name, query.recentProgress or ())
                continue
            with contextlib.suppress(Exception):  # its last progress, where still known
                self._metrics.polled(query_id, query.name, query.recentProgress or ())
            self._metrics.terminated(query_id)
        self._known = active

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
                self._failing = False
            except Exception as exc:  # noqa: BLE001 - the session may come back
                if not self._failing:
                    _LOG.warning("reading the queries' progress failed (retried every %s s): "
                                 "%s", self.interval_s, exc)
                self._failing = True
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(30)


def serve_query_metrics(spark: Any, port: int, address: str = "0.0.0.0", *,
                        poll_interval_s: float | None = None,
                        ) -> tuple[ThreadingHTTPServer, QueryMetrics]:
    """Collect ``spark``'s queries' progress into a :class:`QueryMetrics` and serve it on
    ``address:port`` (0: a free one) from a daemon thread: a listener on a classic session,
    a poll of the active queries every ``poll_interval_s`` seconds (default 5) on a Spark
    Connect session or when ``poll_interval_s`` is given. Returns the server
    (``server.shutdown()`` stops it) and the metrics (``metrics.close()`` stops collecting)."""
    metrics = QueryMetrics(spark.streams)
    if poll_interval_s is None and not is_connect(spark):
        metrics.listen()
    else:
        metrics.poll(poll_interval_s or 5.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return serve_registry(registry, address, port), metrics
