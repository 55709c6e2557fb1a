"""``kafka-share exporter``'s server: a background collector and an HTTP endpoint serving the
last :class:`~pyspark_kafka_share.exporter.collect.Snapshot` as Prometheus metrics
(prometheus_client; the OpenMetrics text when the scraper asks for it).

A scrape never waits for the broker: it renders what the collector last stored (taken under a
lock held only to swap the snapshot), with ``kafka_share_up`` saying whether the last
collection succeeded and ``kafka_share_last_success_timestamp_seconds`` when one last did.
After a failed collection the last values are served as they were (stale), ``up`` is 0.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from pyspark_kafka_share.exporter.collect import Snapshot

__all__ = ["METRICS", "METRIC_NAMES", "Exporter", "serve_registry"]

_LOG = logging.getLogger("pyspark_kafka_share.exporter")

_PARTITION = ("group", "topic", "partition")
METRICS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "kafka_share_up": ("gauge", (), "1 if the last collection from the cluster succeeded, "
                       "else 0 (the other values are then the last ones collected)"),
    "kafka_share_last_success_timestamp_seconds": (
        "gauge", (), "Unix time of the last successful collection (absent before the first)"),
    "kafka_share_collect_duration_seconds": ("gauge", (), "How long the last collection took"),
    "kafka_share_collect_errors": ("counter", (), "Collections that failed"),
    "kafka_share_group_state": ("gauge", ("group", "state"), "1 for the group's state as the "
                                "broker reports it (Stable, Empty, ...; NotFound: no such group)"),
    "kafka_share_group_members": ("gauge", ("group",), "Members of the share group"),
    "kafka_share_group_lag": ("gauge", ("group",), "Records not yet acknowledged for good, "
                              "summed over the partitions whose lag is known"),
    "kafka_share_group_lag_unknown_partitions": (
        "gauge", ("group",), "Partitions whose lag is not known yet (no member has fetched)"),
    "kafka_share_partition_lag": ("gauge", _PARTITION, "Records of the partition not yet "
                                  "acknowledged for good (absent while unknown)"),
    "kafka_share_partition_start_offset": (
        "gauge", _PARTITION, "The share-partition start offset (absent without share state)"),
    "kafka_share_partition_assigned_members": (
        "gauge", _PARTITION, "Members the broker assigned the partition to"),
    "kafka_share_dead_letter_end_offset": (
        "gauge", _PARTITION, "End offset of each partition of the group's dead-letter topic "
        "(label topic: that topic)"),
}
"""``{family: (type, labels, help)}``: every metric the exporter serves (docs/operations.md)."""

METRIC_NAMES = tuple(name + "_total" if kind == "counter" else name
                     for name, (kind, _, _) in METRICS.items())
"""The sample names as a scraper sees them (counters with ``_total``)."""


def _family(name: str) -> GaugeMetricFamily | CounterMetricFamily:
    kind, labels, doc = METRICS[name]
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return GaugeMetricFamily(name, doc, labels=labels)


def _group_families(snapshot: Snapshot) -> Iterator[Metric]:
    fams = {n: _family(n) for n in METRICS if n.startswith(("kafka_share_group",
                                                           "kafka_share_partition",
                                                           "kafka_share_dead"))}
    for g in snapshot.groups:
        fams["kafka_share_group_state"].add_metric([g.group, g.state], 1)
        fams["kafka_share_group_members"].add_metric([g.group], g.members)
        fams["kafka_share_group_lag"].add_metric([g.group], g.total_lag)
        fams["kafka_share_group_lag_unknown_partitions"].add_metric(
            [g.group], g.unknown_lag_partitions)
        for p in g.partitions:
            labels = [g.group, p.topic, str(p.partition)]
            if p.lag is not None:
                fams["kafka_share_partition_lag"].add_metric(labels, p.lag)
            if p.start_offset is not None:
                fams["kafka_share_partition_start_offset"].add_metric(labels, p.start_offset)
            fams["kafka_share_partition_assigned_members"].add_metric(labels,
                                                                      p.assigned_members)
        for topic, partition, end in g.dead_letter_ends:
            fams["kafka_share_dead_letter_end_offset"].add_metric(
                [g.group, topic, str(partition)], end)
    yield from fams.values()


class Exporter(Collector):
    """Collects with ``read`` every ``interval_s`` seconds in a daemon thread; its
    :attr:`registry` renders the last collection. :meth:`serve` answers HTTP."""

    def __init__(self, read: Callable[[], Snapshot], *, interval_s: float = 15.0) -> None:
        self._read = read
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._snapshot = Snapshot(())
        self._up = False
        self._last_success: float | None = None
        self._duration_s = 0.0
        self._errors = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kafka-share-exporter",
                                        daemon=True)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    # -- collecting --------------------------------------------------------------------------

    def collect_once(self) -> bool:
        """One collection; True if it succeeded. Errors are logged and counted, never raised."""
        started = time.monotonic()
        try:
            snapshot = self._read()
        except Exception as exc:  # noqa: BLE001 - any failure: up 0, keep the last values
            with self._lock:
                self._up, self._errors = False, self._errors + 1
                self._duration_s = time.monotonic() - started
                changed, self.last_error = self.last_error != str(exc), str(exc)
            if changed:
                _LOG.warning("collection failed (kafka_share_up 0, last values kept): %s", exc)
            return False
        with self._lock:
            self._snapshot, self._up, self._last_success = snapshot, True, time.time()
            self._duration_s = time.monotonic() - started
            recovered, self.last_error = self.last_error is not None, None
        if recovered:
            _LOG.warning("collection succeeded again (kafka_share_up 1)")
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.collect_once()
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        """The collector thread runs (``/healthz``)."""
        return self._thread.is_alive()

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    # -- rendering ---------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """prometheus_client's hook: the families of the last collection (no broker call)."""
        with self._lock:
            snapshot, up, last, duration, errors = (self._snapshot, self._up,
                                                    self._last_success, self._duration_s,
                                                    self._errors)
        fam = _family("kafka_share_up")
        fam.add_metric([], 1 if up else 0)
        yield fam
        if last is not None:
            fam = _family("kafka_share_last_success_timestamp_seconds")
            fam.add_metric([], last)
            yield fam
        fam = _family("kafka_share_collect_duration_seconds")
        fam.add_metric([], duration)
        yield fam
        fam = _family("kafka_share_collect_errors")
        fam.add_metric([], errors)
        yield fam
        yield from _group_families(snapshot)

    def render(self, accept: str = "") -> tuple[bytes, str]:
        """The metrics page for a scraper's ``Accept`` header and its content type."""
        return _render(self.registry, accept)

    def serve(self, address: str, port: int) -> ThreadingHTTPServer:
        """Answer ``/metrics`` and ``/healthz`` (200 while the collector runs) on
        ``address:port`` (0: a free port) from a daemon thread."""
        return serve_registry(self.registry, address, port, lambda: self.alive)


def _render(registry: CollectorRegistry, accept: str) -> tuple[bytes, str]:
    encoder, content_type = choose_encoder(accept)
    return encoder(registry), content_type


def serve_registry(registry: CollectorRegistry, address: str, port: int,
                   alive: Callable[[], bool] = lambda: True) -> ThreadingHTTPServer:
    """Serve ``registry`` on ``/metrics`` (Prometheus or OpenMetrics text, as the scraper
    asks) and ``/healthz`` (200 while ``alive()``, else 503) on ``address:port`` (0: a free
    port) from a daemon thread; ``server.server_address`` is where, ``server.shutdown()``
    stops it."""
    server = ThreadingHTTPServer((address, port), _handler(registry, alive))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="kafka-share-metrics-http",
                     daemon=True).start()
    return server


def _handler(registry: CollectorRegistry,
             alive: Callable[[], bool]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, content_type = _render(registry, self.headers.get("Accept", ""))
                self._answer(200, body, content_type)
            elif path == "/healthz":
                ok = alive()
                self._answer(200 if ok else 503, b"ok\n" if ok else b"collector stopped\n",
                             "text/plain; charset=utf-8")
            else:
                self._answer(404, b"not found: try /metrics or /healthz\n",
                             "text/plain; charset=utf-8")

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return  # a scrape every 15 s is no news

    return Handler
