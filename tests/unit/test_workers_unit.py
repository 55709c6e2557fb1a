"""Pure unit tests of the queue workers' result handling and control channel (no broker)."""

from __future__ import annotations

import socket
import time

import pytest

from pyspark_kafka_share.errors import OptionError
from pyspark_kafka_share.workers import control_state
from pyspark_kafka_share.workers.control import ControlClient, ControlServer, Endpoint
from pyspark_kafka_share.workers.outcome import Outcome, Result
from pyspark_kafka_share.workers.verdict import normalise as _normalise


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
        assert server.latest()[0]["processed"] == 3
        server.request_stop("time budget")
        server.request_stop("later reasons do not overwrite the first")
        assert client.report({"worker": 0, "attempt": 0, "processed": 4}) is True
        assert server.stop_reason == "time budget"
        # A late line of an old attempt does not replace the retried attempt's report, and
        # both attempts' work is kept.
        ControlClient(server.endpoint, 0.0).report({"worker": 1, "attempt": 1, "processed": 9})
        ControlClient(server.endpoint, 0.0).report({"worker": 1, "attempt": 0, "processed": 1})
        assert server.latest()[1]["processed"] == 9
        assert {k: r["processed"] for k, r in server.reports().items() if k[0] == 1} == \
            {(1, 0): 1, (1, 1): 9}
        client.close()
    finally:
        server.close()
    assert len(seen) == 4


def test_control_rejects_a_wrong_token(caplog: pytest.LogCaptureFixture) -> None:
    server = ControlServer("127.0.0.1")
    try:
        forged = Endpoint(server.endpoint.host, server.endpoint.port, "not-the-token")
        assert ControlClient(forged, 0.0).report({"worker": 0, "attempt": 0}) is False
        assert server.reports() == {}
        assert server.refusals >= 1
        assert "refused a control connection from 127.0.0.1" in caplog.text
        assert server.endpoint.secret not in caplog.text + repr(server.endpoint)
    finally:
        server.close()


def test_a_stranger_gets_a_challenge_and_nothing_else() -> None:
    """A peer that speaks the old protocol (the secret in the line) or garbage is cut off
    before any line is read as a report or a stop request."""
    server = ControlServer("127.0.0.1")
    try:
        for line in (b'{"report": {"worker": 0, "attempt": 0}}\n', b"GET / HTTP/1.0\r\n\r\n",
                     b'{"auth": "00"}\n'):
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
                challenge = s.makefile("rb").readline()
                assert b"nonce" in challenge and server.endpoint.secret.encode() not in challenge
                s.sendall(line)
                assert s.recv(100) == b""  # closed, no reply
        assert server.reports() == {} and server.refusals == 3 and not server.stopping
    finally:
        server.close()


def test_a_pinned_control_port_is_used_and_retried_upwards() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        server = ControlServer("127.0.0.1", port=taken, max_retries=8)
        try:
            assert taken < server.port <= taken + 8  # the pinned port was taken: the next free
            client = ControlClient(server.endpoint, 0.0)
            client.report({"worker": 0, "attempt": 0, "processed": 1})
            assert server.latest()[0]["processed"] == 1
            client.close()
        finally:
            server.close()
    server = ControlServer("127.0.0.1", port=taken)
    try:
        assert server.port == taken  # free now: exactly the pinned port
    finally:
        server.close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(OptionError, match="control_port"):
            ControlServer("127.0.0.1", port=s.getsockname()[1], max_retries=0)


def test_one_attempt_per_worker_holds_the_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """A speculative copy waits while the holder reports; ends if the holder finished; takes
    over when the holder goes silent (its executor died)."""
    monkeypatch.setattr(control_state, "LEASE_EXPIRY_S", 0.5)
    server = ControlServer("127.0.0.1")
    try:
        assert server.lease(0, 0) == (True, False)
        assert server.lease(0, 1) == (False, False)  # speculative copy: wait
        assert server.lease(1, 1) == (True, False)  # other workers are independent
        time.sleep(0.6)
        assert server.lease(0, 1) == (True, False)  # the holder went silent: taken over
        server.update({"worker": 0, "attempt": 1, "state": "stopped"})
        assert server.lease(0, 2) == (False, True)  # the holder finished: do not run
        client = ControlClient(server.endpoint, 0.0)
        assert client.acquire_lease(0, 3) is False
        assert client.acquire_lease(2, 0) is True
        server.request_stop("interrupted")
        assert client.acquire_lease(3, 0) is False
        client.close()
    finally:
        server.close()


def test_without_a_driver_the_lease_is_local() -> None:
    assert ControlClient(None, 1.0).acquire_lease(0, 0) is True


def test_unreachable_driver_means_local_stop_conditions_only() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = ControlClient(Endpoint("127.0.0.1", port, "t"), interval_s=0.0)
    assert client.report({"worker": 0}) is False
    assert not client.lost and not client.ever_connected  # the worker's local idle stop applies


def test_losing_the_driver_stops_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control_state, "LOST_AFTER_S", 0.2)
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
