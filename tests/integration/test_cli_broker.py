"""``kafka-share broker --topic name:partitions --port --data-dir``: a laptop's broker in one
command, whose data can outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, ShareConsumer

from pyspark_kafka_share.admin import ShareGroupAdmin
from pyspark_kafka_share.cli import EXIT_USAGE
from pyspark_kafka_share.harness import ENV_BOOTSTRAP
from pyspark_kafka_share.harness._process import free_port
from pyspark_kafka_share.harness.broker import DATA_DIR_MARK
from tests.helpers import poll_share

_ENV = {k: v for k, v in os.environ.items() if k != ENV_BOOTSTRAP}
_CLI = [sys.executable, "-m", "pyspark_kafka_share.cli", "broker"]


def _start(*args: str) -> tuple[subprocess.Popen[str], str]:
    """``kafka-share broker ARGS`` in the background, and the address it printed."""
    proc = subprocess.Popen([*_CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_ENV)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().strip()


def _ctrl_c(proc: subprocess.Popen[str]) -> str:
    """Stop the broker as Ctrl-C does; it must exit cleanly; its stderr. 120 s only bounds a
    broker that does not stop (it is then terminated, not left running, and the test fails);
    a check of the elapsed time after ``communicate(timeout=120)`` could never fail."""
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        pytest.fail("the broker did not stop within 120 s of Ctrl-C")
    assert proc.returncode == 0, err
    return err


def test_broker_creates_topics_prints_its_address_and_stops_on_ctrl_c() -> None:
    port = free_port()
    proc, address = _start("--topic", "orders:3", "--topic", "returns", "--port", str(port))
    try:
        assert address == f"127.0.0.1:{port}", (address, proc.poll())
        from confluent_kafka.admin import AdminClient

        topics = AdminClient({"bootstrap.servers": address}).list_topics(timeout=30).topics
        assert len(topics["orders"].partitions) == 3
        assert len(topics["returns"].partitions) == 1
        with ShareGroupAdmin(address, timeout_s=30) as admin:
            assert admin.list_groups() == []
    finally:
        err = _ctrl_c(proc)
    assert "# topic orders: 3 partition(s)" in err and "Ctrl-C stops the broker" in err


def _values(address: str, topic: str, expect: int) -> list[str]:
    """Every record value of ``topic``, read from the start by a classic consumer."""
    c = Consumer({"bootstrap.servers": address, "group.id": f"reader-{time.monotonic_ns()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    out: list[str] = []
    deadline = time.monotonic() + 60
    try:
        while len(out) < expect and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                out.append((m.value() or b"").decode())
    finally:
        c.close()
    return out


def _share_values(address: str, group: str, timeout_s: float, *, count: int | None = None,
                  quiet_s: float | None = None) -> list[str]:
    """What a member of share group ``group`` on ``orders`` gets (ACCEPTed and committed):
    ``count`` records, or all it gets until ``quiet_s`` without one; ``timeout_s`` at most."""
    c = ShareConsumer({"bootstrap.servers": address, "group.id": group,
                       "share.acknowledgement.mode": "explicit"})
    c.subscribe(["orders"])
    until = None if count is None else (lambda seen: len(seen) >= count)
    try:
        return [(m.value() or b"").decode()
                for m in poll_share(c, timeout_s=timeout_s, until=until, quiet_s=quiet_s)]
    finally:
        c.close()


def test_broker_data_dir_keeps_topics_records_and_share_groups_across_a_restart(
    tmp_path: Path,
) -> None:
    data = tmp_path / "kafka-data"
    first = [f"r{i}" for i in range(100)]
    later = [f"s{i}" for i in range(20)]
    proc, address = _start("--data-dir", str(data), "--topic", "orders:2")
    try:
        producer = Producer({"bootstrap.servers": address})
        for v in first:
            producer.produce("orders", v.encode())
        assert producer.flush(30) == 0
        with ShareGroupAdmin(address, timeout_s=30) as admin:
            admin.set_config("g", "share.auto.offset.reset", "earliest")
        got = _share_values(address, "g", 60, count=len(first))
        assert sorted(got) == sorted(first)
        for v in later:  # produced, not consumed by the group
            producer.produce("orders", v.encode())
        assert producer.flush(30) == 0
    finally:
        err = _ctrl_c(proc)
    assert f"# data: {data} (kept when the broker stops)" in err
    assert (data / DATA_DIR_MARK).is_file() and (data / "data" / "meta.properties").is_file()

    proc, address = _start("--data-dir", str(data), "--topic", "orders:2")  # a new free port
    try:
        from confluent_kafka.admin import AdminClient

        topics = AdminClient({"bootstrap.servers": address}).list_topics(timeout=30).topics
        assert len(topics["orders"].partitions) == 2
        assert sorted(_values(address, "orders", len(first) + len(later))) == \
            sorted(first + later)
        # The group's acknowledgements were kept: it gets only what it had not read.
        got = _share_values(address, "g", 60, count=len(later))
        got += _share_values(address, "g", 10, quiet_s=3)
        assert sorted(got) == sorted(later)
    finally:
        err = _ctrl_c(proc)
    assert "# topic orders: 2 partition(s), kept in the data dir" in err
    assert (data / "data" / "meta.properties").is_file()


@pytest.mark.parametrize("case", ["not-a-brokers", "secured"])
def test_broker_refuses_a_data_dir_it_cannot_use(case: str, tmp_path: Path) -> None:
    data = tmp_path / "photos"
    data.mkdir()
    (data / "holiday.jpg").write_bytes(b"\xff\xd8")
    extra = ["--security", "ssl"] if case == "secured" else []
    if case == "secured":
        data = tmp_path / "new"
    started = time.monotonic()
    done = subprocess.run([*_CLI, "--data-dir", str(data), *extra], capture_output=True,
                          text=True, env=_ENV, timeout=120, check=False)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert done.stdout == ""  # no broker address: none started
    assert f"option '--data-dir' = '{data}'" in done.stderr
    fix = "plaintext listener" if case == "secured" else "not empty and holds no earlier broker"
    assert fix in done.stderr
    # At once, not after starting a broker (no address on stdout, above, says none started):
    # 1.2 s at a load average of 32, so 30 s is no tight bound.
    assert time.monotonic() - started < 30
    assert [p.name for p in (tmp_path / "photos").iterdir()] == ["holiday.jpg"]
