"""The brokers tier's network faults on one broker's client link (its Toxiproxy proxy), shared
by the source's and the workers' tests: 500 ms of latency each way, connections reset a while
into their responses (mid-fetch, mid-acknowledgement), and a slow drip.

:func:`run_network_faults` applies them one after the other while a stream runs, each for a
fixed time (the fault itself), and after each waits until the stream makes progress again
(the system recovered before the next fault lands). What each fault did is returned: the bytes
the proxy carried while the toxic was on (the toxic was hit: clients talked to the faulty link)
and the progress the stream made meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql.streaming.query import StreamingQuery

from pyspark_kafka_share.harness import Toxiproxy
from tests.helpers import wait_for

__all__ = ["NETWORK_FAULTS", "TOXICS", "FaultHit", "NetworkFault", "RowsRead", "more_than",
           "run_network_faults"]


Toxics = Callable[[Toxiproxy, str], list[str]]
"""Adds a fault's toxics to a proxy; returns their names."""


@dataclass(frozen=True)
class NetworkFault:
    """A toxic (or several) on one proxy, held for ``hold_s`` seconds."""

    name: str
    add: Toxics
    hold_s: float


TOXICS: dict[str, Toxics] = {
    "net-latency": lambda t, p: [t.latency(p, 500, 100, stream=s)
                                 for s in ("downstream", "upstream")],
    # Each connection is reset (TCP RST) 300 ms after it first carries a response, again and
    # again as clients reconnect: fetch and acknowledgement responses are cut mid-way (the
    # broker acquired or acknowledged, the client never hears of it).
    "net-reset": lambda t, p: [t.reset_peer(p, 300)],
    "net-blackhole": lambda t, p: t.blackhole(p),
    "net-slow-drip": lambda t, p: t.slow_drip(p, chunk_bytes=64, delay_us=2_000,
                                              rate_kb_s=32),
}
"""The network faults by kind (also the chaos-scale schedule's kinds)."""

NETWORK_FAULTS = (
    NetworkFault("latency 500 ms (jitter 100 ms) each way", TOXICS["net-latency"], 12.0),
    NetworkFault("connections reset 300 ms into their responses", TOXICS["net-reset"], 8.0),
    NetworkFault("slow drip: responses in ~64-byte slices 2 ms apart, at most 32 KB/s",
                 TOXICS["net-slow-drip"], 12.0),
)


@dataclass(frozen=True)
class FaultHit:
    """What one network fault did."""

    fault: NetworkFault
    proxy: str
    bytes_through: int  # bytes the proxy received (either side) while the toxic was on
    progress_before: int
    progress_during: int  # progress made while the toxic was on

    def describe(self) -> str:
        return (f"{self.fault.name} on {self.proxy} for {self.fault.hold_s:.0f}s at progress "
                f"{self.progress_before}: {self.bytes_through} bytes through it, "
                f"+{self.progress_during} progress meanwhile")


def run_network_faults(toxiproxy: Toxiproxy, proxy: str, progress: Callable[[], int], *,
                       recover_s: float = 180.0) -> list[FaultHit]:
    """Each of :data:`NETWORK_FAULTS` on ``proxy`` in turn; after each, wait until
    ``progress()`` (rows read, records processed) grew past its value at the fault's end."""
    hits = []
    for fault in NETWORK_FAULTS:
        before, through = progress(), toxiproxy.bytes_through(proxy)
        names = fault.add(toxiproxy, proxy)
        time.sleep(fault.hold_s)  # the fault itself
        through = toxiproxy.bytes_through(proxy) - through
        for name in names:
            toxiproxy.remove_toxic(proxy, name)
        at_end = progress()
        hits.append(FaultHit(fault, proxy, through, before, at_end - before))
        wait_for(progress, more_than(at_end), recover_s, f"progress after {fault.name}")
    return hits


def more_than(at: int) -> Callable[[int], bool]:
    """A :func:`~tests.helpers.wait_for` condition: progress past ``at``."""
    return lambda n: n > at


class RowsRead:
    """Rows a running query has read, from its progress reports. Kept per batch id, so that
    the count survives Spark keeping only its latest reports (100 by default; a steady stream
    of small batches passes that in minutes) and counts a re-run batch once. Call it at least
    once per 100 batches."""

    def __init__(self, query: StreamingQuery) -> None:
        self.query = query
        self.rows: dict[int, int] = {}

    def __call__(self) -> int:
        for p in self.query.recentProgress:
            self.rows[int(p["batchId"])] = int(p.get("numInputRows", 0))
        return sum(self.rows.values())

    def until(self, rows: int, timeout_s: float, what: str) -> None:
        """Wait until the query has read ``rows`` rows; fail early if it stopped."""
        deadline = time.monotonic() + timeout_s
        while self() < rows:
            assert self.query.isActive, f"{what}: the query stopped: {self.query.exception()}"
            assert time.monotonic() < deadline, \
                f"{what}: {self()} of {rows} rows read after {timeout_s:.0f}s"
            time.sleep(1.0)
