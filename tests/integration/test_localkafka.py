"""The harness's own promises, tested for real."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pyspark_kafka_share.errors import LocalKafkaError
from pyspark_kafka_share.harness import ENV_BOOTSTRAP, LocalKafka
from tests.helpers import record_value

# Starts a broker, crashes it and restarts it, then waits for a line on stdin (EOF: exit).
_OWNER = """
import sys
from pyspark_kafka_share.harness import LocalKafka
k = LocalKafka().start()
first = k._proc.pid
k.kill()
k.restart()
print(first, k._proc.pid, k._workdir, flush=True)
sys.stdin.readline()
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); read its state.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.broker
@pytest.mark.skipif(bool(os.environ.get(ENV_BOOTSTRAP)), reason="starts its own broker")
@pytest.mark.parametrize("end", ["sigkill", "exit"])
def test_restarted_jvm_dies_with_its_owner_and_its_dir_goes(end: str) -> None:
    """The exit hooks and die-with-parent cover a JVM started by restart(): a killed owner's
    broker is killed by the kernel and its dir swept by the next start; an owner exiting
    normally stops its broker and deletes the dir itself."""
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None and owner.stdin is not None
        first_s, jvm_pid_s, workdir = owner.stdout.readline().split()
        first, jvm_pid = int(first_s), int(jvm_pid_s)
        assert not _alive(first), "kill() left the first JVM running"
        assert _alive(jvm_pid)
        if end == "sigkill":
            owner.send_signal(signal.SIGKILL)  # no atexit, no finally: only the kernel can help
            owner.wait(10)
        else:
            owner.stdin.close()
            assert owner.wait(60) == 0
        deadline = time.monotonic() + 20
        while _alive(jvm_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(jvm_pid), "the restarted broker JVM outlived its owner"
        if end == "exit":
            assert not Path(workdir).exists(), "atexit did not stop the restarted broker"
        else:
            assert Path(workdir).exists()
            with LocalKafka() as _:  # the next start sweeps the orphaned data dir
                assert not Path(workdir).exists()
    finally:
        owner.kill()


@pytest.mark.broker
@pytest.mark.skipif(bool(os.environ.get(ENV_BOOTSTRAP)), reason="starts its own broker")
def test_failed_start_raises_with_log_tail_and_leaves_no_jvm() -> None:
    bad = LocalKafka(extra_config={"group.share.record.lock.duration.ms": "-5"},
                     start_timeout_s=60)
    with pytest.raises(LocalKafkaError) as info:
        bad.start()
    assert "log tail" in str(info.value) or "formatting" in str(info.value)
    assert bad._proc is None and bad._workdir is None


@pytest.mark.broker
def test_external_broker_is_used_without_starting_one(
    kafka: LocalKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_BOOTSTRAP, kafka.bootstrap_servers)
    with LocalKafka() as other:
        assert other.is_external
        assert other.bootstrap_servers == kafka.bootstrap_servers
        assert other.log_path is None
        assert other._proc is None


# `kafka-share broker` printing its address and stopping on Ctrl-C: tests/integration/
# test_cli_broker.py (the console script itself runs in every `make test`: `make jars`).


@pytest.mark.broker
def test_run_tool_prints_no_info_lines(kafka: LocalKafka) -> None:
    args = ("ShareGroupCommand", "--bootstrap-server", kafka.bootstrap_servers, "--list")
    quiet = kafka.run_tool(*args)
    assert " INFO " not in quiet.stdout + quiet.stderr, quiet.stdout + quiet.stderr
    verbose = kafka.run_tool(*args, log_level="INFO")  # the check above can see INFO lines
    assert " INFO " in verbose.stderr and " INFO " not in verbose.stdout
    assert verbose.stdout == quiet.stdout or not quiet.stdout.strip()


# -- kill() and restart() -----------------------------------------------------------------------


def _share_consume(bootstrap: str, group: str, topic: str, *, accept: int | None,
                   want: int, timeout_s: float = 60.0, settle_s: float = 0.0) -> dict[bytes, int]:
    """Share-consume until ``want`` records arrived (then ``settle_s`` more): ACCEPT the first
    ``accept`` (all if None), RELEASE the rest, commit every batch. Returns value -> delivery
    count of the records ACCEPTed (and, with accept=None, of all)."""
    from confluent_kafka import AcknowledgeType, ShareConsumer

    consumer = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                                   "share.acknowledgement.mode": "explicit"})
    consumer.subscribe([topic])
    accepted: dict[bytes, int] = {}
    seen = 0
    deadline = time.monotonic() + timeout_s
    settle_until: float | None = None
    try:
        while time.monotonic() < (settle_until or deadline):
            batch = consumer.poll(0.5)
            for msg in batch:
                assert msg.error() is None, msg.error()
                seen += 1
                if accept is None or len(accepted) < accept:
                    value, delivery_count = record_value(msg), msg.delivery_count()
                    assert value not in accepted, f"{value!r} delivered twice"
                    assert delivery_count is not None
                    accepted[value] = delivery_count
                    consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
                else:
                    consumer.acknowledge(msg, AcknowledgeType.RELEASE)
            if len(batch):
                assert all(err is None for err in consumer.commit_sync().values())
            if seen >= want and settle_until is None:
                settle_until = time.monotonic() + settle_s
    finally:
        consumer.close()
    assert seen >= want, f"got {seen} of {want} records within {timeout_s}s"
    return accepted


def _read_all(bootstrap: str, topic: str, partitions: int, want: int) -> list[bytes]:
    """Every record of the topic, read from the beginning with a plain consumer."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "localkafka-read-all",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(got) < want and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                assert msg.error() is None, msg.error()
                value = msg.value()
                assert value is not None
                got.append(value)
    finally:
        consumer.close()
    return got


@pytest.mark.broker
@pytest.mark.skipif(bool(os.environ.get(ENV_BOOTSTRAP)), reason="starts its own broker")
def test_kill_and_restart_keep_records_ports_and_share_group_state() -> None:
    values = [f"order-{i}".encode() for i in range(40)]
    group = "outage-workers"
    pids: list[int] = []
    with LocalKafka() as kafka:
        bootstrap, workdir = kafka.bootstrap_servers, kafka._workdir
        assert workdir is not None and kafka._proc is not None
        pids.append(kafka._proc.pid)
        topic = kafka.create_topic("orders", partitions=2)
        kafka.produce(topic, values)
        kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
        before = _share_consume(bootstrap, group, topic, accept=15, want=40)

        kafka.kill()  # a crash: no controlled shutdown
        assert not kafka.is_running and not _alive(pids[0])
        assert kafka.bootstrap_servers == bootstrap and workdir.exists()
        host, port = bootstrap.split(":")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host, int(port)), timeout=5).close()
        with pytest.raises(LocalKafkaError, match="failed"):
            kafka.produce(topic, [b"lost"], producer_config={"message.timeout.ms": "3000"})
        with pytest.raises(LocalKafkaError, match="restart"):
            kafka.start()  # a killed broker is restarted, not started
        kafka.kill()  # idempotent

        # Restarted from a short-lived thread, as a timer rehearsing an outage would: the new
        # JVM must not die with that thread (PR_SET_PDEATHSIG follows the forking thread).
        errors: list[BaseException] = []

        def restart() -> None:
            try:
                kafka.restart()
            except BaseException as exc:  # noqa: BLE001 - re-raised by the test
                errors.append(exc)

        thread = threading.Thread(target=restart)
        thread.start()
        thread.join()
        if errors:
            raise errors[0]
        time.sleep(1)
        assert kafka.is_running and kafka._proc is not None
        pids.append(kafka._proc.pid)
        assert kafka.bootstrap_servers == bootstrap

        assert sorted(_read_all(bootstrap, topic, 2, len(values))) == sorted(values)
        # The share group's state survived: what was ACCEPTed is not delivered again, the
        # RELEASEd rest is.
        after = _share_consume(bootstrap, group, topic, accept=None, want=25, settle_s=3.0)
        assert set(after) == set(values) - set(before)

        kafka.restart()  # while running: a clean stop (SIGTERM) first, then the same data
        assert kafka._proc is not None and kafka._proc.pid not in pids
        pids.append(kafka._proc.pid)
        kafka.produce(topic, [b"after-restarts"])
        got = _read_all(bootstrap, topic, 2, len(values) + 1)
        assert sorted(got) == sorted([*values, b"after-restarts"])
        assert b"restarting the broker" in (workdir / "broker.log").read_bytes()
    assert not workdir.exists()
    assert not any(_alive(pid) for pid in pids)
    with pytest.raises(LocalKafkaError, match="not started"):
        kafka.restart()  # stop() deleted the data: start() a new broker instead
