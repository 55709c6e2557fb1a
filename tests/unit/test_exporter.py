"""The exporter's server without a broker: a scrape answers from the last collection at once
(a slow or failing collection never holds it), up/last-success, /healthz, the names served.

The collections are plain functions returning snapshots (a pure unit test); the real broker
is in tests/integration/test_exporter.py.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pyspark_kafka_share.exporter.collect import GroupSnapshot, PartitionRow, Snapshot
from pyspark_kafka_share.exporter.serve import METRIC_NAMES, METRICS, Exporter

SNAPSHOT = Snapshot((GroupSnapshot(
    "g", "Stable", 2,
    (PartitionRow("t", 0, 10, 5, 2), PartitionRow("t", 1, None, None, 1)),
    (("t.dlq", 0, 3),)),))


def _get(url: str, accept: str = "") -> tuple[int, str, str]:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


class Gate:
    """A collection that returns SNAPSHOT, or fails, each time it is let through."""

    def __init__(self) -> None:
        self.calls = threading.Semaphore(0)
        self.fail = False
        self.entered = threading.Event()

    def __call__(self) -> Snapshot:
        self.entered.set()
        assert self.calls.acquire(timeout=30), "never let through"
        if self.fail:
            raise ConnectionError("broker unreachable")
        return SNAPSHOT


@pytest.fixture
def served() -> Iterator[tuple[Exporter, Gate, str]]:
    gate = Gate()
    exporter = Exporter(gate, interval_s=0.01)
    server = exporter.serve("127.0.0.1", 0)
    exporter.start()
    yield exporter, gate, f"http://127.0.0.1:{server.server_address[1]}"
    gate.fail = True
    for _ in range(5):
        gate.calls.release()
    exporter.stop(timeout_s=10)
    server.shutdown()
    server.server_close()


def _wait(predicate: object, what: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_scrape_answers_at_once_while_the_collection_hangs(
        served: tuple[Exporter, Gate, str]) -> None:
    exporter, gate, url = served
    assert gate.entered.wait(10)  # the first collection is blocked in the "broker"
    started = time.monotonic()
    status, _, text = _get(f"{url}/metrics")
    assert time.monotonic() - started < 1.0 and status == 200
    samples = _samples(text)
    assert samples[("kafka_share_up", ())] == 0
    assert not any(name == "kafka_share_last_success_timestamp_seconds" for name, _ in samples)

    gate.calls.release()  # the collection returns
    _wait(lambda: _samples(_get(f"{url}/metrics")[2]).get(("kafka_share_up", ())) == 1, "up")
    samples = _samples(_get(f"{url}/metrics")[2])
    part0 = (("group", "g"), ("partition", "0"), ("topic", "t"))
    assert samples[("kafka_share_partition_lag", part0)] == 5
    assert samples[("kafka_share_partition_start_offset", part0)] == 10
    assert samples[("kafka_share_partition_assigned_members",
                    (("group", "g"), ("partition", "1"), ("topic", "t")))] == 1
    assert ("kafka_share_partition_lag", (("group", "g"), ("partition", "1"),
                                          ("topic", "t"))) not in samples  # unknown: absent
    assert samples[("kafka_share_group_lag", (("group", "g"),))] == 5
    assert samples[("kafka_share_group_lag_unknown_partitions", (("group", "g"),))] == 1
    assert samples[("kafka_share_group_members", (("group", "g"),))] == 2
    assert samples[("kafka_share_group_state", (("group", "g"), ("state", "Stable")))] == 1
    assert samples[("kafka_share_dead_letter_end_offset",
                    (("group", "g"), ("partition", "0"), ("topic", "t.dlq")))] == 3
    last = samples[("kafka_share_last_success_timestamp_seconds", ())]
    assert abs(last - time.time()) < 30

    gate.fail = True  # the broker goes away: up 0, the last values stay, errors counted
    gate.calls.release()
    _wait(lambda: _samples(_get(f"{url}/metrics")[2]).get(("kafka_share_up", ())) == 0,
          "up 0")
    samples = _samples(_get(f"{url}/metrics")[2])
    assert samples[("kafka_share_partition_lag", part0)] == 5
    assert samples[("kafka_share_last_success_timestamp_seconds", ())] == last
    assert samples[("kafka_share_collect_errors_total", ())] >= 1
    assert exporter.last_error == "broker unreachable"


def test_every_metric_is_named_as_documented_and_served(
        served: tuple[Exporter, Gate, str]) -> None:
    _, gate, url = served
    gate.calls.release()
    _wait(lambda: _samples(_get(f"{url}/metrics")[2]).get(("kafka_share_up", ())) == 1, "up")
    names = {name for name, _ in _samples(_get(f"{url}/metrics")[2])}
    assert names == set(METRIC_NAMES)
    assert all(n.startswith("kafka_share_") for n in METRICS)


def test_openmetrics_when_asked_healthz_and_not_found(
        served: tuple[Exporter, Gate, str]) -> None:
    _, _, url = served
    status, ctype, text = _get(f"{url}/metrics", "application/openmetrics-text; version=1.0.0")
    assert status == 200 and ctype.startswith("application/openmetrics-text")
    assert text.rstrip().endswith("# EOF") and "kafka_share_collect_errors_total" in text
    assert _get(f"{url}/healthz")[:1] == (200,)
    assert _get(f"{url}/nothing")[0] == 404
    exporter, gate, url = served
    gate.fail = True
    for _ in range(3):
        gate.calls.release()
    exporter.stop(timeout_s=10)  # the collector ends: the process is no longer live
    assert _get(f"{url}/healthz")[0] == 503
