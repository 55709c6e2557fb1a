"""The harness's own promises, tested for real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyspark_kafka_share.errors import LocalKafkaError
from pyspark_kafka_share.localkafka import ENV_BOOTSTRAP, LocalKafka

_OWNER = """
import sys, time
from pyspark_kafka_share.localkafka import LocalKafka
k = LocalKafka().start()
print(k._proc.pid, k._workdir, flush=True)
time.sleep(600)
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
def test_jvm_dies_with_a_killed_owner_and_its_dir_is_swept() -> None:
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        jvm_pid_s, workdir = owner.stdout.readline().split()
        jvm_pid = int(jvm_pid_s)
        assert _alive(jvm_pid)
        owner.send_signal(signal.SIGKILL)  # no atexit, no finally: only the kernel can help
        owner.wait(10)
        deadline = time.monotonic() + 20
        while _alive(jvm_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(jvm_pid), "the broker JVM outlived its killed owner"
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


@pytest.mark.broker
@pytest.mark.skipif(bool(os.environ.get(ENV_BOOTSTRAP)), reason="starts its own broker")
def test_cli_broker_prints_bootstrap_and_stops_on_ctrl_c() -> None:
    from confluent_kafka.admin import AdminClient

    exe = Path(sys.executable).parent / "kafka-share"
    proc = subprocess.Popen([str(exe), "broker"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        bootstrap = proc.stdout.readline().strip()
        assert bootstrap.startswith("127.0.0.1:")
        assert AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).brokers
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        proc.kill()
