"""The control channel between the driver and queue workers running as Spark tasks.

Spark offers no live channel from a running task to the driver (accumulators arrive when a task
ends), so the driver listens on a TCP port, as Spark's own executors reach the driver. Each
worker sends its counters as one JSON line every ``interval`` seconds and reads one line back:
``{"stop": true}`` once the driver wants the workers to stop (time budget, idle timeout, record
count, :meth:`WorkerJob.stop`, Ctrl-C). A random token keeps strangers' lines out.

The channel is best effort for progress and required for nothing else: a worker that cannot
reach the driver at start runs on its local stop conditions; a worker that *loses* the driver
after reaching it stops (the driver is gone or the job is being torn down).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["ControlClient", "ControlServer", "Endpoint"]

# A worker that reached the driver and then fails to for this long stops.
_LOST_AFTER_S = 15.0


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    token: str


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        owner = self.server.owner
        with owner._lock:
            owner._conns.add(self.request)
        for raw in self.rfile:
            try:
                msg = json.loads(raw)
            except ValueError:
                return
            if not isinstance(msg, dict) or msg.get("token") != owner.endpoint.token:
                return
            owner.update(msg)
            reply = json.dumps({"stop": owner.stopping}).encode() + b"\n"
            try:
                self.wfile.write(reply)
                self.wfile.flush()
            except OSError:
                return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: ControlServer


class ControlServer:
    """Driver side: collects the workers' latest reports and carries the stop flag."""

    def __init__(self, advertised_host: str, on_report: Callable[[dict[str, Any]], None]
                 | None = None) -> None:
        self._server = _Server(("0.0.0.0", 0), _Handler)
        self._server.owner = self
        self.endpoint = Endpoint(advertised_host, self._server.server_address[1],
                                 secrets.token_hex(16))
        self._lock = threading.Lock()
        self._reports: dict[int, dict[str, Any]] = {}
        self._conns: set[socket.socket] = set()
        self._stop_reason: str | None = None
        self._on_report = on_report
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="kafka-share-workers-control", daemon=True)
        self._thread.start()

    @property
    def stopping(self) -> bool:
        return self._stop_reason is not None

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason

    def request_stop(self, reason: str) -> None:
        with self._lock:
            if self._stop_reason is None:
                self._stop_reason = reason

    def update(self, msg: dict[str, Any]) -> None:
        report = msg.get("report")
        if not isinstance(report, dict):
            return
        with self._lock:
            worker = int(report.get("worker", -1))
            prev = self._reports.get(worker)
            # A retried task attempt replaces its predecessor; a late line of the old one does not.
            if prev is None or int(report.get("attempt", 0)) >= int(prev.get("attempt", 0)):
                self._reports[worker] = report
        if self._on_report is not None:
            self._on_report(report)

    def reports(self) -> dict[int, dict[str, Any]]:
        with self._lock:
            return {k: dict(v) for k, v in self._reports.items()}

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:  # workers still connected see the driver go
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
                conn.close()


class ControlClient:
    """Worker side: sends reports, learns whether to stop. Never raises.

    :meth:`start` reports from a daemon thread, so a slow or silent driver never delays the
    worker's processing loop; the loop only reads :attr:`stop`.
    """

    def __init__(self, endpoint: Endpoint | None, interval_s: float) -> None:
        self.endpoint = endpoint
        self.interval_s = interval_s
        self._sock: socket.socket | None = None
        self._reader: Any = None
        self.ever_connected = False
        self._last_ok = time.monotonic()
        self.stop = False
        self.lost = False
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    def start(self, snapshot: Callable[[], dict[str, Any]]) -> None:
        """Report ``snapshot()`` every ``interval_s`` from a daemon thread until :meth:`close`."""
        if self.endpoint is None:
            return

        def loop() -> None:
            while not self._closed.wait(self.interval_s):
                try:
                    report = snapshot()
                except RuntimeError:  # a counter changed size while copied: next time
                    continue
                self.report(report)

        self._thread = threading.Thread(target=loop, name="kafka-share-worker-report",
                                        daemon=True)
        self._thread.start()

    def _connect(self) -> bool:
        assert self.endpoint is not None
        try:
            sock = socket.create_connection((self.endpoint.host, self.endpoint.port), timeout=2)
        except OSError:
            return False
        sock.settimeout(5)
        self._sock = sock
        self._reader = sock.makefile("rb")
        self.ever_connected = True
        return True

    def _drop(self) -> None:
        with contextlib.suppress(OSError):
            if self._reader is not None:
                self._reader.close()
            if self._sock is not None:
                self._sock.close()
        self._sock = None
        self._reader = None

    def report(self, report: dict[str, Any]) -> bool:
        """Send ``report`` now; True = stop. The background thread calls it every
        ``interval_s``; the worker once more with its final counters."""
        if self.endpoint is None or self.lost:
            return self.stop
        line = json.dumps({"token": self.endpoint.token, "report": report}).encode() + b"\n"
        for _ in range(2):
            if self._sock is None and not self._connect():
                break
            assert self._sock is not None
            try:
                self._sock.sendall(line)
                reply = self._reader.readline()
            except OSError:
                self._drop()
                continue
            if not reply:
                self._drop()
                continue
            with contextlib.suppress(ValueError):
                self.stop = self.stop or bool(json.loads(reply).get("stop"))
            self._last_ok = time.monotonic()
            return self.stop
        if self.ever_connected and time.monotonic() - self._last_ok > _LOST_AFTER_S:
            self.lost = True
            self.stop = True
        return self.stop

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(10)
        self._drop()
