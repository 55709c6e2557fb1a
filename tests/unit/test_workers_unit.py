"""Pure unit tests of the queue workers' result handling and control channel (no broker)."""

from __future__ import annotations

import socket
import time

import pytest

from pyspark_kafka_share.workers import control as _control
from pyspark_kafka_share.workers.control import ControlClient, ControlServer, Endpoint
from pyspark_kafka_share.workers.loop import Outcome, Result, _normalise


@pytest.mark.parametrize(("given", "outcome", "value"), [
    (None, Outcome.ACCEPT, None),
    (b"out", Outcome.ACCEPT, b"out"),
    ("out", Outcome.ACCEPT, b"out"),
    (Outcome.RELEASE, Outcome.RELEASE, None),
    (Result.accept("v", key="k"), Outcome.ACCEPT, b"v"),
    (Result.reject("bad"), Outcome.REJECT, None),
])
def test_results_normalise(given: object, outcome: Outcome, value: bytes | None) -> None:
    v = _normalise(given)  # type: ignore[arg-type]
    assert (v.outcome, v.value) == (outcome, value)


def test_a_wrong_result_type_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="returned int for a record"):
        _normalise(42)  # type: ignore[arg-type]


def test_control_round_trip_and_stop() -> None:
    seen: list[dict[str, object]] = []
    server = ControlServer("127.0.0.1", on_report=seen.append)
    try:
        client = ControlClient(server.endpoint, interval_s=0.0)
        assert client.report({"worker": 0, "attempt": 0, "processed": 3}) is False
        assert server.reports()[0]["processed"] == 3
        server.request_stop("time budget")
        server.request_stop("later reasons do not overwrite the first")
        assert client.report({"worker": 0, "attempt": 0, "processed": 4}) is True
        assert server.stop_reason == "time budget"
        # A late line of an old attempt does not replace the retried attempt's report.
        ControlClient(server.endpoint, 0.0).report({"worker": 1, "attempt": 1, "processed": 9})
        ControlClient(server.endpoint, 0.0).report({"worker": 1, "attempt": 0, "processed": 1})
        assert server.reports()[1]["processed"] == 9
        client.close()
    finally:
        server.close()
    assert len(seen) == 4


def test_control_rejects_a_wrong_token() -> None:
    server = ControlServer("127.0.0.1")
    try:
        forged = Endpoint(server.endpoint.host, server.endpoint.port, "not-the-token")
        assert ControlClient(forged, 0.0).report({"worker": 0, "attempt": 0}) is False
        assert server.reports() == {}
    finally:
        server.close()


def test_unreachable_driver_means_local_stop_conditions_only() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ControlClient(Endpoint("127.0.0.1", port, "t"), interval_s=0.0)
    assert client.report({"worker": 0}) is False
    assert not client.lost and not client.ever_connected  # the worker's local idle stop applies


def test_losing_the_driver_stops_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_control, "_LOST_AFTER_S", 0.2)
    server = ControlServer("127.0.0.1")
    client = ControlClient(server.endpoint, interval_s=0.05)
    client.start(lambda: {"worker": 0, "attempt": 0})
    deadline = time.monotonic() + 5
    while not client.ever_connected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.ever_connected and not client.stop
    server.close()  # also drops the connections it had accepted
    deadline = time.monotonic() + 5
    while not client.stop and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.stop and client.lost
    client.close()
