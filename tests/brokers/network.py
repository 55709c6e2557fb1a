"""The brokers tier's network faults on one broker's client link (its Toxiproxy proxy), shared
by the source's and the workers' tests: 500 ms of latency each way, connections reset a while
into their responses (mid-fetch, mid-acknowledgement), and a slow drip.

:func:`run_network_faults` applies them one after the other while a stream runs, each for a
fixed time (the fault itself), and after each waits until the stream makes progress again
(the system recovered before the next fault lands). What each fault did is returned: what a
probe through the proxy met while the toxic was on (a Kafka ApiVersions request on a
connection of its own: its round trip, how many reads its answer took, whether a second
request on the connection was reset), the bytes of the proxy's connections (Toxiproxy counts a
connection's bytes when it ends: the resets show there, a live connection under latency does
not), and the progress the stream made meanwhile.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql.streaming.query import StreamingQuery

from pyspark_kafka_share.harness import Toxiproxy
from tests.helpers import wait_for

__all__ = ["NETWORK_FAULTS", "TOXICS", "FaultHit", "NetworkFault", "Probe", "RowsRead",
           "check_hits", "more_than", "probe", "run_network_faults"]


Toxics = Callable[[Toxiproxy, str], list[str]]
"""Adds a fault's toxics to a proxy; returns their names."""


@dataclass(frozen=True)
class Probe:
    """An ApiVersions request through a proxy, on a connection of its own."""

    round_trip_s: float  # request sent to the whole answer read
    reads: int  # recv() calls the answer took (a slow drip slices it)
    reset: bool  # a second request 0.5 s later met a reset or a closed connection

    def __str__(self) -> str:
        return (f"probe: answer in {self.round_trip_s * 1000:.0f} ms over {self.reads} reads, "
                f"{'reset' if self.reset else 'not reset'} 0.5 s later")


@dataclass(frozen=True)
class NetworkFault:
    """A toxic (or several) on one proxy, held for ``hold_s`` seconds; ``hit`` tells from a
    :class:`Probe` through the proxy that the toxic acts."""

    name: str
    add: Toxics
    hold_s: float
    hit: Callable[[Probe], bool]


TOXICS: dict[str, Toxics] = {
    "net-latency": lambda t, p: [t.latency(p, 500, 100, stream=s)
                                 for s in ("downstream", "upstream")],
    # A connection's next response is swallowed and the connection reset (TCP RST) 300 ms
    # later, again and again as clients reconnect: fetch and acknowledgement responses are
    # lost mid-way (the broker acquired or acknowledged, the client never hears of it).
    "net-reset": lambda t, p: [t.reset_peer(p, 300)],
    "net-blackhole": lambda t, p: t.blackhole(p),
    "net-slow-drip": lambda t, p: t.slow_drip(p, chunk_bytes=64, delay_us=2_000,
                                              rate_kb_s=32),
}
"""The network faults by kind (also the chaos-scale schedule's kinds)."""

NETWORK_FAULTS = (
    NetworkFault("latency 500 ms (jitter 100 ms) each way", TOXICS["net-latency"], 12.0,
                 lambda p: p.round_trip_s >= 0.5),
    NetworkFault("responses swallowed, connections reset 300 ms later", TOXICS["net-reset"], 8.0,
                 lambda p: p.reset),
    NetworkFault("slow drip: responses in ~64-byte slices 2 ms apart, at most 32 KB/s",
                 TOXICS["net-slow-drip"], 12.0, lambda p: p.reads >= 3),
)


def _request(sock: socket.socket) -> tuple[float, int]:
    """Send ApiVersions v0 and read its whole answer: (seconds, reads)."""
    body = struct.pack(">hhih", 18, 0, 7, -1)  # api key, version, correlation id, no client id
    began, reads, answer = time.monotonic(), 0, b""
    sock.sendall(struct.pack(">i", len(body)) + body)
    while len(answer) < 4 or len(answer) < 4 + struct.unpack(">i", answer[:4])[0]:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionResetError("closed by the proxy")
        answer, reads = answer + chunk, reads + 1
    return time.monotonic() - began, reads


def probe(address: str) -> Probe:
    """A :class:`Probe` through ``address`` (``host:port``, a proxy's listener)."""
    host, port = address.rsplit(":", 1)
    began = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        try:
            round_trip, reads = _request(sock)
        except OSError:  # reset before the whole answer came
            return Probe(time.monotonic() - began, 0, reset=True)
        time.sleep(0.5)
        try:
            _request(sock)
        except OSError:
            return Probe(round_trip, reads, reset=True)
    return Probe(round_trip, reads, reset=False)


@dataclass(frozen=True)
class FaultHit:
    """What one network fault did."""

    fault: NetworkFault
    proxy: str
    probe: Probe  # through the proxy while the toxic was on
    bytes_through: int  # bytes of the proxy's connections that ended while it was on
    progress_before: int
    progress_during: int  # progress made while the toxic was on

    @property
    def hit(self) -> bool:
        return self.fault.hit(self.probe)

    def describe(self) -> str:
        return (f"{self.fault.name} on {self.proxy} for {self.fault.hold_s:.0f}s at progress "
                f"{self.progress_before}: {self.probe}; {self.bytes_through} bytes of "
                f"connections ended meanwhile, +{self.progress_during} progress")


def run_network_faults(toxiproxy: Toxiproxy, proxy: str, progress: Callable[[], int], *,
                       recover_s: float = 180.0) -> list[FaultHit]:
    """Each of :data:`NETWORK_FAULTS` on ``proxy`` in turn; after each, wait until
    ``progress()`` (rows read, records processed) grew past its value at the fault's end."""
    hits = []
    listen = str(toxiproxy.proxies()[proxy]["listen"])
    for fault in NETWORK_FAULTS:
        before, through = progress(), toxiproxy.bytes_through(proxy)
        names = fault.add(toxiproxy, proxy)
        began = time.monotonic()
        seen = probe(listen)
        time.sleep(max(0.0, fault.hold_s - (time.monotonic() - began)))  # the fault itself
        through = toxiproxy.bytes_through(proxy) - through
        for name in names:
            toxiproxy.remove_toxic(proxy, name)
        at_end = progress()
        hits.append(FaultHit(fault, proxy, seen, through, before, at_end - before))
        wait_for(progress, more_than(at_end), recover_s, f"progress after {fault.name}")
    return hits


def check_hits(hits: list[FaultHit], where: str, produced: str, producer_errors: list[str],
               report: Callable[[str], None]) -> None:
    """Report each fault ``where`` it acted and ``produced`` (what the run made of it); fail
    if the steady producer failed or a fault's probe did not meet its toxic (the fault never
    acted, and the test would prove nothing)."""
    for hit in hits:
        report(f"{where}: {hit.describe()}")
    report(produced)
    assert not producer_errors, f"the producer failed: {producer_errors[:3]}"
    for hit in hits:
        assert hit.hit, f"the probe through the proxy did not meet the toxic: {hit.describe()}"


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
