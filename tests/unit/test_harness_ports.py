"""The harness's ports: picked below the ephemeral range, never handed out twice, and a start
whose port another process took before the JVM bound it ("Address already in use", issue 37)
retried on fresh ports, bounded and logged.

Pure unit tests: the JVM is replaced by a fake launcher (a shell child that writes Kafka's bind
failure to the broker's log and exits, or one that stays up); no Java, no broker.
"""

from __future__ import annotations

import logging
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pyspark_kafka_share.errors import LocalKafkaError
from pyspark_kafka_share.harness import LocalKafka, LocalKafkaCluster, _process
from pyspark_kafka_share.harness import broker as broker_module
from pyspark_kafka_share.harness import cluster as cluster_module

_TAKEN_LINE = ("[2026-11-27 21:00:00,000] ERROR Exiting Kafka due to fatal exception during "
               "startup. (kafka.Kafka$)\norg.apache.kafka.common.KafkaException: Socket server "
               "failed to bind to 127.0.0.1:{port}: Address already in use.\n")


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


# -- picking ports -------------------------------------------------------------------------------


def test_free_ports_are_below_the_ephemeral_range_free_and_never_handed_twice() -> None:
    floor = _process._ephemeral_floor()
    ports = [_process.free_port() for _ in range(100)]
    assert len(set(ports)) == 100
    assert all(10_000 <= p < floor for p in ports), (floor, sorted(ports)[:3], max(ports))
    assert all(_bindable(p) for p in ports)


def test_a_port_in_use_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        draws = iter([busy, busy])
        drawn: list[int] = []
        random_port = _process._RANDOM.randrange

        def randrange(lo: int, hi: int) -> int:
            drawn.append(next(draws, None) or random_port(lo, hi))
            return drawn[-1]

        monkeypatch.setattr(_process._RANDOM, "randrange", randrange)
        monkeypatch.setattr(_process, "_ephemeral_floor", lambda: 65_000)
        port = _process.free_port()
        assert drawn[:2] == [busy, busy] and port == drawn[2] != busy and _bindable(port)
        again = _process.free_port()
        assert again != port, "never a port handed out before"


def test_without_room_below_the_ephemeral_range_the_os_picks(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "range").write_text("10500\t60999\n")
    monkeypatch.setattr(_process, "_EPHEMERAL", tmp_path / "range")
    assert _process._ephemeral_floor() == 10_500
    ports = {_process.free_port() for _ in range(5)}
    assert len(ports) == 5 and all(_bindable(p) for p in ports)


# -- reading a bind failure ------------------------------------------------------------------------


def test_a_bind_failure_is_read_from_kafkas_log_with_its_address() -> None:
    assert _process.port_taken("started\n" + _TAKEN_LINE.format(port=20417)) == \
        "127.0.0.1:20417"
    assert _process.port_taken("java.net.BindException: Address already in use") == "a port"
    assert _process.port_taken("Socket server failed to bind to 10.0.0.9:9092: Cannot "
                               "assign requested address.") is None
    assert _process.port_taken("") is None


# -- start_on_free_ports ---------------------------------------------------------------------------


class _Script:
    """A fake start: the failures it raises in turn (then success), and what it was asked."""

    def __init__(self, *failures: BaseException, taken: str | None = "127.0.0.1:20001") -> None:
        self.failures = list(failures)
        self.taken_answer = taken
        self.starts = self.resets = self.asked = 0

    def start(self) -> None:
        self.starts += 1
        if self.failures:
            raise self.failures.pop(0)

    def taken(self) -> str | None:
        self.asked += 1
        return self.taken_answer

    def reset(self) -> None:
        self.resets += 1


def test_a_taken_port_is_retried_on_fresh_ports_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    script = _Script(LocalKafkaError("exited with code 1"), LocalKafkaError("exited again"))
    with caplog.at_level(logging.WARNING, logger=_process.__name__):
        _process.start_on_free_ports(script.start, script.taken, script.reset, "the broker")
    assert (script.starts, script.resets) == (3, 2)
    assert [r.getMessage() for r in caplog.records] == [
        f"the broker: 127.0.0.1:20001 was taken before it could bind it; starting again on "
        f"fresh ports (start {n} of 3)" for n in (2, 3)]


def test_other_failures_are_not_retried() -> None:
    script = _Script(LocalKafkaError("did not answer within 90s"), taken=None)
    with pytest.raises(LocalKafkaError, match="did not answer"):
        _process.start_on_free_ports(script.start, script.taken, script.reset, "the broker")
    assert (script.starts, script.resets, script.asked) == (1, 1, 1)
    interrupted = _Script(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        _process.start_on_free_ports(interrupted.start, interrupted.taken, interrupted.reset,
                                     "the broker")
    assert (interrupted.starts, interrupted.resets, interrupted.asked) == (1, 1, 0)


def test_the_retries_are_bounded() -> None:
    script = _Script(*(LocalKafkaError(f"exited {n}") for n in range(5)))
    with pytest.raises(LocalKafkaError, match=r"the broker could not bind its ports in 3 "
                       r"starts \(the last time 127.0.0.1:20001 was already in use\): exited 2"):
        _process.start_on_free_ports(script.start, script.taken, script.reset, "the broker")
    assert (script.starts, script.resets) == (3, 3)


# -- LocalKafka and LocalKafkaCluster with a fake launcher ---------------------------------------


class _FakeLauncher:
    """Stands in for the JVM: ``_prepare`` picks the ports (as the real one does, with
    :func:`free_port`) without formatting anything; the first ``losing`` JVMs started write
    Kafka's bind failure for their client port to their log and exit, the others stay up."""

    def __init__(self, tmp_path: Path, losing: int) -> None:
        self.tmp_path, self.losing = tmp_path, losing
        self.ports: list[int] = []  # each prepared JVM's client port, in order
        self.port_of: dict[str, int] = {}  # by the JVM's server.properties
        self.lost: list[int] = []

    def prepare(self, kafka: LocalKafka) -> None:
        kafka._workdir = self.tmp_path / f"run{len(self.ports)}"
        kafka._workdir.mkdir()
        port = kafka.port or _process.free_port()
        self.ports.append(port)
        self.port_of[str(kafka._workdir / "server.properties")] = port
        kafka._bootstrap = f"127.0.0.1:{port}"

    def spawn(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        if self.losing:
            self.losing -= 1
            port = self.port_of[argv[-1]]
            self.lost.append(port)
            kwargs["stdout"].write(_TAKEN_LINE.format(port=port).encode())
            kwargs["stdout"].flush()
            return subprocess.Popen(["sh", "-c", "exit 1"], start_new_session=True)
        return subprocess.Popen(["sleep", "60"], start_new_session=True)

    def wait_ready(self, kafka: LocalKafka, deadline: float) -> None:
        assert kafka._proc is not None
        try:
            code = kafka._proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            return
        raise LocalKafkaError(f"the Kafka broker exited with code {code} while starting")


@pytest.fixture
def launcher(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[_FakeLauncher]:
    fake = _FakeLauncher(tmp_path, losing=0)
    monkeypatch.delenv(broker_module.ENV_BOOTSTRAP, raising=False)

    def prepare(kafka: LocalKafka) -> None:  # a function: set on the class, given the broker
        fake.prepare(kafka)

    def wait_ready(kafka: LocalKafka, deadline: float) -> None:
        fake.wait_ready(kafka, deadline)

    monkeypatch.setattr(LocalKafka, "_prepare", prepare)
    monkeypatch.setattr(LocalKafka, "_wait_ready", wait_ready)
    monkeypatch.setattr(broker_module, "require_tool", lambda *a: "java")
    monkeypatch.setattr(broker_module, "ensure_jars", lambda *a: tmp_path)
    monkeypatch.setattr(broker_module, "broker_log4j", lambda libs: tmp_path / "log4j2.yaml")
    monkeypatch.setattr(_process, "spawn", fake.spawn)
    yield fake


def test_a_broker_whose_port_was_taken_starts_again_on_fresh_ports(
        launcher: _FakeLauncher, caplog: pytest.LogCaptureFixture) -> None:
    launcher.losing = 2
    kafka = LocalKafka()
    with caplog.at_level(logging.WARNING, logger=_process.__name__):
        kafka.start()
    try:
        assert kafka.is_running and len(launcher.ports) == 3 and len(set(launcher.ports)) == 3
        assert kafka.bootstrap_servers == f"127.0.0.1:{launcher.ports[2]}"
        assert launcher.lost == launcher.ports[:2]
        assert not (launcher.tmp_path / "run0").exists(), "a failed start's data is deleted"
        assert [r.getMessage().split(" was taken")[0] for r in caplog.records] == [
            f"the Kafka broker: 127.0.0.1:{p}" for p in launcher.ports[:2]]
    finally:
        kafka.stop()
    assert not kafka.is_running


def test_a_broker_reads_only_its_last_jvms_log(launcher: _FakeLauncher) -> None:
    """A failure of an earlier JVM in the same log (a kept data_dir's) is not this one's."""
    kafka = LocalKafka()
    kafka.start()
    try:
        assert kafka.log_path is not None
        with kafka.log_path.open("ab") as log:
            log.write(_TAKEN_LINE.format(port=20002).encode())
        assert kafka._port_taken() == "127.0.0.1:20002"
        kafka.restart()  # the same ports; its JVM appends to the log
        assert kafka._port_taken() is None
    finally:
        kafka.stop()


def test_the_callers_own_port_taken_is_not_retried(launcher: _FakeLauncher) -> None:
    launcher.losing = 1
    port = _process.free_port()
    with pytest.raises(LocalKafkaError, match="exited with code 1"):
        LocalKafka(port=port).start()
    assert launcher.ports == [port]


def test_a_cluster_whose_node_lost_a_port_starts_again_on_a_new_layout(
        launcher: _FakeLauncher, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(cluster_module, "ensure_jars", lambda *a: launcher.tmp_path)
    launcher.losing = 1
    cluster = LocalKafkaCluster()
    with caplog.at_level(logging.WARNING, logger=_process.__name__):
        cluster.start()
    try:
        assert cluster.is_running and cluster.node_ids == [1, 2, 3]
        assert len(launcher.ports) == 6, "every node prepared again"
        assert launcher.lost == launcher.ports[:1]
        first, second = set(launcher.ports[:3]), set(launcher.ports[3:])
        assert not first & second, "the new layout's ports are fresh ones"
        assert {int(a.rsplit(":")[1]) for a in cluster.bootstrap_servers.split(",")} == second
        assert len(caplog.records) == 1 and "the Kafka cluster: 127.0.0.1:" in \
            caplog.records[0].getMessage()
    finally:
        cluster.stop()
    assert not cluster.is_running
