"""A queue worker whose only broker is down for longer than ``broker_timeout_s`` fails, with
either client (``client="librdkafka"``, ``"native"``), instead of reading the outage's empty
polls as "no data" and idling on (docs/workers.md, ``broker_timeout_s``).

The worker runs in this process (no Spark: the loop, its consumer and its ``BrokerWatch`` are
the same); the broker is the test's own (``chaos_kafka``), SIGKILLed once the worker has
processed what was produced, and not restarted."""

from __future__ import annotations

import threading
import time

import pytest

from pyspark_kafka_share.errors import BrokerError
from pyspark_kafka_share.harness import LocalKafka
from pyspark_kafka_share.workers import Record
from pyspark_kafka_share.workers.config import WorkerConfig, WorkerSpec
from pyspark_kafka_share.workers.loop import _Worker

pytestmark = pytest.mark.broker  # chaos_kafka is not one of the session broker's fixtures

TIMEOUT_S = 5.0  # broker_timeout_s
N = 5


@pytest.mark.parametrize("client", ["librdkafka", "native"])
def test_a_worker_fails_when_its_broker_is_down_longer_than_broker_timeout_s(
    chaos_kafka: LocalKafka, client: str,
) -> None:
    kafka = chaos_kafka
    topic, group = kafka.create_topic(f"outage-{client}", 1), f"outage-{client}"
    kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
    kafka.produce(topic, [b"%d" % i for i in range(N)])
    config = WorkerConfig.create(topics=topic, group=group, client=client,
                                 bootstrap_servers=kafka.bootstrap_servers,
                                 broker_timeout_s=TIMEOUT_S)
    seen: list[int] = []
    worker = _Worker(WorkerSpec(config, lock_ms=30_000, delivery_limit=5),
                     lambda r: seen.append(r.offset) if isinstance(r, Record) else None)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - the test's verdict
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # only guards a hang: a start on a loaded machine
    while len(seen) < N:
        assert thread.is_alive(), f"the worker ended before the outage: {failure}"
        assert time.monotonic() < deadline, f"the worker processed {seen} of {N}"
        time.sleep(0.1)
    kafka.kill()
    killed = time.monotonic()
    thread.join(120)  # only guards a hang: it fails after TIMEOUT_S and a few 1 s checks
    took = time.monotonic() - killed
    assert not thread.is_alive(), f"the {client} worker idled through a {took:.0f} s outage"
    assert len(failure) == 1 and isinstance(failure[0], BrokerError), failure
    assert f"all brokers down for more than {TIMEOUT_S:.0f}s" in str(failure[0]), failure[0]
    assert "_ALL_BROKERS_DOWN" in str(failure[0]), failure[0]
    # Not before the limit: an outage shorter than broker_timeout_s is ridden out. The upper
    # bound is generous for a loaded machine (the checks run every second, 1 s each at most).
    assert TIMEOUT_S <= took < TIMEOUT_S + 60, f"failed {took:.1f} s after the kill"
    assert sorted(seen) == list(range(N))
