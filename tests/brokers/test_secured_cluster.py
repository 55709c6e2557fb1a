"""The three-broker cluster on SASL_SSL (SCRAM-SHA-512 over TLS, ACLs on), a cluster of the
module's own beside the tier's plaintext one: the source with its exactly-once journal reads
through a busy partition leader's SIGKILL; every record once in the sink."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pyspark_kafka_share.harness import LocalKafkaCluster
from tests.brokers.network import RowsRead
from tests.helpers import assert_exactly_once, produce_spread, sink_keys, start_parquet

pytestmark = [pytest.mark.brokers, pytest.mark.broker]

N = 6_000  # records over 3 partitions


@pytest.fixture(scope="module")
def secured_cluster() -> Iterator[LocalKafkaCluster]:
    with LocalKafkaCluster(security="sasl_ssl", session_timeout_ms=6_000, heap="512m") as c:
        yield c


def test_source_exactly_once_on_sasl_ssl_when_a_busy_partitions_leader_is_killed(
    spark: SparkSession, secured_cluster: LocalKafkaCluster, tmp_path: Path,
    fault_report: Callable[[str], None],
) -> None:
    """The source connects as the harness's admin user over SASL_SSL (the CA, SCRAM-SHA-512
    credentials: ``client_config``'s settings as ``kafka.*`` options); partition 0's leader is
    SIGKILLed mid-stream; the clients find the new leader on its SASL_SSL listener."""
    kafka = secured_cluster
    topic = kafka.create_topic(f"sec-{uuid.uuid4().hex[:8]}", 3)
    group = f"sec-g-{uuid.uuid4().hex[:8]}"
    kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
    kafka.set_group_config(group, "share.record.lock.duration.ms", 8_000)
    expected = produce_spread(kafka.node(1), topic, 3, N)
    conf = kafka.client_config(mechanism="SCRAM-SHA-512")
    assert conf["security.protocol"].upper() == "SASL_SSL", conf["security.protocol"]
    reader = (spark.readStream.format("kafka-share").option("kafka.group.id", group)
              .option("subscribe", topic).option("journalPath", str(tmp_path / "journal"))
              .option("numPartitions", 3).option("maxRecordsPerTrigger", 500)
              .option("pollTimeoutMs", 1500))
    for key, value in conf.items():
        reader = reader.option(f"kafka.{key}", str(value))
    q = start_parquet(reader.load(), tmp_path / "out", tmp_path / "chk")
    rows = RowsRead(q)
    try:
        rows.until(1_000, 240, "before the kill")
        leader, read_at_kill = kafka.leader(topic, 0), rows()
        kafka.kill(leader)
        moved = kafka.wait_for_leader(topic, 0, not_on={leader})
        rows.until(N, 300, "after the kill")
    finally:
        q.stop()
    fault_report(f"SASL_SSL: node {leader} (leader of {topic}-0) killed after {read_at_kill} of "
                 f"{N} rows; the leadership moved to node {moved}")
    assert read_at_kill < N, "the query read everything before the kill: nothing was proven"
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)
