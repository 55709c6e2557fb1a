"""The Java client's share consumer in the same share group as two queue workers on the native
client (``client="native"``): Kafka's own ``ConsoleShareConsumer`` (kafka-tools, from the jars
the harness runs the broker with) prints every record it gets; the workers write theirs to an
output topic. The records split between them, and every record is accepted once overall."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share.admin import ShareGroupAdmin
from pyspark_kafka_share.errors import GroupNotFoundError
from pyspark_kafka_share.harness import LocalKafka
from pyspark_kafka_share.harness.broker_files import tool_log4j
from pyspark_kafka_share.harness.jars import ensure_jars, require_tool
from pyspark_kafka_share.workers import Record, Result, start_workers
from tests.fixtures.kafka import TopicFactory
from tests.helpers import log_offsets, read_topic, stop_when_drained, wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

BATCHES, PER_BATCH = 40, 10  # small producer batches: every fetch finds a few
MAX_BATCHES = 300


def _java_share_consumer(kafka: LocalKafka, group: str, topic: str,
                         out: Path, err: Path) -> subprocess.Popen[bytes]:
    """Kafka's console share consumer (ACCEPTs what it prints), its values to ``out``."""
    libs = ensure_jars(kafka.version)
    cmd = [require_tool("java", "Kafka's tools run in a JVM"), "-Xmx256m",
           f"-Dlog4j2.configurationFile={tool_log4j(libs, 'WARN')}", "-cp", f"{libs}/*",
           "org.apache.kafka.tools.consumer.ConsoleShareConsumer",
           "--bootstrap-server", kafka.bootstrap_servers, "--group", group, "--topic", topic,
           "--command-property", "max.poll.records=10",
           "--timeout-ms", "300000"]  # a safety net: the test ends it (SIGTERM)
    with out.open("wb") as stdout, err.open("wb") as stderr:
        return subprocess.Popen(cmd, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL)


def _produce_until_split(kafka: LocalKafka, topic: str, java_out: Path, out: str) -> int:
    """Producer batches of ``PER_BATCH`` records (a flush after each), values ``0``, ``1``, ...:
    ``BATCHES`` of them, then more until both the Java consumer has printed a record and the
    workers have written one (at most ``MAX_BATCHES``: which fetch a batch lands in is the
    broker's choice, and on a loaded machine one side can take the first few hundred); the
    count produced."""
    extra: dict[str, Any] = {"linger.ms": 0, "acks": "all"}
    producer = Producer(kafka.client_config(**extra))
    b = 0
    while b < BATCHES or (b < MAX_BATCHES and not (
            java_out.stat().st_size and _written(kafka, out))):
        for i in range(PER_BATCH):
            producer.produce(topic, value=b"%d" % (b * PER_BATCH + i))
        assert producer.flush(30) == 0, "records left undelivered"
        b += 1
        if b >= BATCHES:
            time.sleep(0.2)  # pacing only: lets both sides' fetches come back
    return b * PER_BATCH


def _written(kafka: LocalKafka, topic: str) -> bool:
    """Whether ``topic`` (one partition) has a record."""
    return log_offsets(kafka, [(topic, 0)], "latest")[0] > 0


def _members(admin: ShareGroupAdmin, group: str) -> int:
    try:
        return len(admin.describe(group).members)
    except GroupNotFoundError:  # nobody joined yet
        return 0


def _echo(rec: Record) -> Result:
    time.sleep(0.01)  # a little work: the Java consumer's fetches get their turn
    return Result.accept(rec.value)


def test_a_java_share_consumer_and_two_native_workers_split_the_records_once(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
    tmp_path: Path,
) -> None:
    src, out = topic_factory(1), topic_factory(1)
    java_out, java_err = tmp_path / "java.out", tmp_path / "java.err"
    java = _java_share_consumer(kafka, group, src, java_out, java_err)
    job = None
    try:
        job = start_workers(spark, _echo, client="native", topics=src, group=group,
                            bootstrap_servers=kafka.bootstrap_servers, workers=2, chunk_size=5,
                            output_topic=out, on_progress=False)
        with ShareGroupAdmin(kafka.bootstrap_servers) as admin:
            wait_for(lambda: _members(admin, group), lambda n: n == 3, 120,
                     "the Java consumer and both workers in the group")
        produced = _produce_until_split(kafka, src, java_out, out)
        summary = stop_when_drained(job, kafka, group, timeout_s=180)  # bounds a hang only
        job = None
    finally:
        if job is not None:
            job.stop("the test failed", grace_s=30)
        java.terminate()  # its shutdown hook closes the consumer (acknowledging what it got)
        java.wait(60)
    java_got = java_out.read_text().split()
    workers_got = [(m.value() or b"").decode()
                   for m in read_topic(kafka, out, summary.totals["accepted"])]
    every = Counter(java_got + workers_got)
    expected = {str(i) for i in range(produced)}
    note = (f"Java consumer: {len(java_got)} records; the native workers: {len(workers_got)}; "
            f"Java's stderr: {java_err.read_text()[-2000:]}")
    assert set(every) == expected, f"missing {sorted(expected - set(every))[:5]}; {note}"
    assert [v for v, n in every.items() if n > 1] == [], note
    assert java_got and workers_got, f"the records did not split: {note}"
    assert summary.totals["ack_failures"] == 0, str(summary)
