"""Where a worker's time goes: per-phase timings kept as the worker's counters (issue 40).

Each phase has a sum (``<phase>_ms``, in :data:`~pyspark_kafka_share.workers.api.COUNTERS`,
served as ``kafka_share_workers_<phase>_seconds_total``) and a maximum over one occurrence
(``<phase>_max_ms``, in :data:`MAXIMA`, the largest over a worker's attempts and over the
workers in the totals, served as the gauge ``kafka_share_workers_<phase>_max_seconds``).
Timed once per poll, call or transaction: never per record.

- ``poll_wait``: a poll that returned records (librdkafka's share fetch wait included);
- ``marker_wait``: the exactly-once barrier after a poll (the marker read's catch-up), and
  ``marker_open_txn``: the part of it after the reader first stood at a transaction still open
  below the marker topic's end (another worker's, being committed); ``marker_hold``: after a
  barrier missed its deadline, the wait before the next poll for the marker topic's end
  (``TransactionalSettler.idle``: no record acquired meanwhile); ``marker_gc``: the check
  before each poll whether tombstones are due (``ExactlyOnce.due``: every 30 s it starts a
  read of the group's start offsets on a thread of its own, then tombstones the markers
  they passed; that read on the worker's thread was the exactly-once latency tail);
- ``function``: one call of the function (a chunk, or one unit in flight);
- ``txn_held``: how long a transaction's first chunk waited in the open transaction for
  ``transaction_interval_s`` (or the poll's end) before the transaction began;
- ``txn_produce``: ``begin_transaction``, the produces and their flush (outputs, dead letters,
  the marker, tombstones); ``txn_check``: the commit check (the lock deadline, the session);
  ``txn_commit``: ``commit_transaction``; ``txn_ack``: the acknowledgements and their
  ``commit_sync`` after the commit.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

__all__ = ["MAXIMA", "PHASES", "Phases", "phase_line"]

PHASES = ("poll_wait", "marker_wait", "marker_open_txn", "marker_hold", "marker_gc", "function",
          "txn_held", "txn_produce", "txn_check", "txn_commit", "txn_ack")
MAXIMA = tuple(f"{p}_max_ms" for p in PHASES)
"""The maxima's keys: combined by ``max``, never summed."""


class Phases:
    """Adds phases' times to ``stats``: ``<phase>_ms`` (the sum, kept exact in seconds here
    and written rounded down to ms) and ``<phase>_max_ms``. One instance per set of phases
    (the loop's and the settler's are disjoint)."""

    def __init__(self, stats: Counter[str]) -> None:
        self.stats = stats
        self._sums: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        seconds = max(0.0, seconds)
        total = self._sums.get(phase, 0.0) + seconds
        self._sums[phase] = total
        self.stats[f"{phase}_ms"] = int(total * 1000)
        key = f"{phase}_max_ms"
        self.stats[key] = max(self.stats[key], int(seconds * 1000))

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Time the block (also when it raises)."""
        t0 = time.monotonic()
        try:
            yield
        finally:
            self.add(phase, time.monotonic() - t0)


def phase_line(totals: Mapping[str, int]) -> str | None:
    """The summary's line of where the time went: each phase that took any, its total and its
    longest single occurrence (``function 41.2s (max 1.02s)``); None when none was timed."""
    parts = [f"{p} {totals.get(f'{p}_ms', 0) / 1000:.1f}s "
             f"(max {totals.get(f'{p}_max_ms', 0) / 1000:.2f}s)"
             for p in PHASES if totals.get(f"{p}_ms") or totals.get(f"{p}_max_ms")]
    return "  time per phase, all workers: " + ", ".join(parts) if parts else None
