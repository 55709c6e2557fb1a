"""``kafka-share broker --topic name:partitions --port``: a laptop's broker in one command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from pyspark_kafka_share.admin import ShareGroupAdmin
from pyspark_kafka_share.harness import ENV_BOOTSTRAP
from pyspark_kafka_share.harness._process import free_port


def test_broker_creates_topics_prints_its_address_and_stops_on_ctrl_c() -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != ENV_BOOTSTRAP}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyspark_kafka_share.cli", "broker", "--topic", "orders:3",
         "--topic", "returns", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        assert address == f"127.0.0.1:{port}", (address, proc.poll())
        from confluent_kafka.admin import AdminClient

        topics = AdminClient({"bootstrap.servers": address}).list_topics(timeout=30).topics
        assert len(topics["orders"].partitions) == 3
        assert len(topics["returns"].partitions) == 1
        with ShareGroupAdmin(address, timeout_s=30) as admin:
            assert admin.list_groups() == []
    finally:
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "# topic orders: 3 partition(s)" in err and "Ctrl-C stops the broker" in err
    assert time.monotonic() - started < 120
