"""The driver's side of the control channel, whatever the transport: reports, leases, the stop.

:class:`ControlState` is what both transports (:mod:`.control`, TCP; :mod:`.control_kafka`,
a control topic) keep on the driver; :func:`start_reporter` is how both transports' workers
report. Neither transport module imports the other for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["LEASE_EXPIRY_S", "LOST_AFTER_S", "ControlState", "start_reporter"]

LOST_AFTER_S = 15.0
"""A worker that reached the driver and then fails to for this long stops."""
LEASE_EXPIRY_S = 10.0
"""The holder of a worker index's lease that has not reported for this long has lost it (its
executor died): a retried or speculative attempt takes over."""


class ControlState:
    """The driver's side, whatever the transport: keeps every attempt's latest report, grants
    leases and carries the stop flag. Thread-safe; the transports call :meth:`answer`."""

    def __init__(self, on_report: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._reports: dict[tuple[int, int], dict[str, Any]] = {}
        self._seen: dict[tuple[int, int], float] = {}
        self._holders: dict[int, int] = {}  # worker index -> attempt holding its lease
        self._stop_reason: str | None = None
        self._on_report = on_report
        self.refusals = 0

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

    def answer(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The reply to one authenticated message (a report or a lease request)."""
        lease = msg.get("lease")
        if isinstance(lease, dict):
            granted, done = self.lease(int(lease.get("worker", -1)),
                                       int(lease.get("attempt", 0)))
            return {"granted": granted, "done": done, "stop": self.stopping}
        report = msg.get("report")
        if isinstance(report, dict):
            self.update(report)
        return {"stop": self.stopping}

    def lease(self, worker: int, attempt: int) -> tuple[bool, bool]:
        """(granted, done) for ``attempt`` of worker ``worker``.

        One attempt per worker index runs a consumer. The lease goes to the first attempt that
        asks, and passes to another only when its holder has not reported for
        :data:`LEASE_EXPIRY_S` (its executor died; Spark retries the task). ``done``: the
        holder finished, or the driver asked every worker to stop: the asking attempt should
        end at once (a speculative copy of a finished worker).
        """
        now = time.monotonic()
        with self._lock:
            if self._stop_reason is not None:
                return False, True
            holder = self._holders.get(worker)
            if holder is None or holder == attempt or \
                    now - self._seen.get((worker, holder), 0.0) > LEASE_EXPIRY_S:
                if holder is None or holder != attempt:
                    self._holders[worker] = attempt
                    self._seen[(worker, attempt)] = now
                    # Shown (and summed) even if the attempt dies before its first report.
                    self._reports.setdefault((worker, attempt), {
                        "worker": worker, "attempt": attempt, "state": "starting"})
                return True, False
            finished = self._reports.get((worker, holder), {}).get("state") == "stopped"
            return False, finished

    def update(self, report: dict[str, Any]) -> None:
        key = (int(report.get("worker", -1)), int(report.get("attempt", 0)))
        with self._lock:
            self._reports[key] = report
            self._seen[key] = time.monotonic()
        if self._on_report is not None:
            self._on_report(report)

    def reports(self) -> dict[tuple[int, int], dict[str, Any]]:
        """Every attempt's latest report, by (worker, attempt)."""
        with self._lock:
            return {k: dict(v) for k, v in self._reports.items()}

    def latest(self) -> dict[int, dict[str, Any]]:
        """Each worker's newest attempt's latest report, by worker."""
        out: dict[int, dict[str, Any]] = {}
        for (worker, _attempt), report in sorted(self.reports().items()):
            out[worker] = report
        return out


def start_reporter(closed: threading.Event, interval_s: float,
                   snapshot: Callable[[], dict[str, Any]],
                   report: Callable[[dict[str, Any]], object]) -> threading.Thread:
    """A daemon thread that sends ``report(snapshot())`` every ``interval_s`` until ``closed``
    is set (both transports' workers report this way)."""

    def loop() -> None:
        while not closed.wait(interval_s):
            try:
                current = snapshot()
            except RuntimeError:  # a counter changed size while copied: next time
                continue
            report(current)

    thread = threading.Thread(target=loop, name="kafka-share-worker-report", daemon=True)
    thread.start()
    return thread
