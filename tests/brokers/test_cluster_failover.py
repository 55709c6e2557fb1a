"""The three-broker cluster itself: a partition's leader killed, the leadership moves to a
follower and the cluster keeps taking and serving records through the new leader's proxy;
``kafka-share broker --brokers 3`` for users."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, TopicPartition

from pyspark_kafka_share.harness import LocalKafkaCluster, ProducerRecord, Toxiproxy
from tests.fixtures.brokers import ClusterTopicFactory
from tests.helpers import wait_for


def _read_partition(kafka: LocalKafkaCluster, topic: str, partition: int,
                    expect: int) -> list[bytes]:
    """Every value of ``topic``'s ``partition`` from its start (a classic consumer)."""
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers,
                  "group.id": f"reader-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": "false"})
    try:
        c.assign([TopicPartition(topic, partition, 0)])
        got: list[bytes] = []
        misses = 0
        while len(got) < expect and misses < 30:
            msgs = c.consume(500, timeout=1.0)
            misses = 0 if msgs else misses + 1
            got += [m.value() or b"" for m in msgs if m.error() is None]
        return got
    finally:
        c.close()


def test_leader_killed_moves_to_a_follower_which_serves_through_its_proxy(
    kafka_cluster: LocalKafkaCluster, toxiproxy: Toxiproxy,
    cluster_topic_factory: ClusterTopicFactory, fault_report: Callable[[str], None],
) -> None:
    topic = cluster_topic_factory(3)
    md = kafka_cluster.admin().list_topics(topic=topic, timeout=10).topics[topic].partitions[0]
    assert sorted(md.replicas) == [1, 2, 3] and sorted(md.isrs) == [1, 2, 3], md
    before = [ProducerRecord(value=b"before-%d" % i, partition=0) for i in range(500)]
    kafka_cluster.produce(topic, before)
    leader = kafka_cluster.leader(topic, 0)
    kafka_cluster.kill(leader)
    moved = kafka_cluster.wait_for_leader(topic, 0, not_on={leader})
    proxy = kafka_cluster.proxy_name(moved)
    bytes_before = toxiproxy.bytes_through(proxy)
    # acks=all with two replicas in sync: min.insync.replicas=2 still lets writes in.
    kafka_cluster.produce(topic, [ProducerRecord(value=b"after-%d" % i, partition=0)
                                  for i in range(500)])
    got = _read_partition(kafka_cluster, topic, 0, 1000)
    assert sorted(got) == sorted([b"before-%d" % i for i in range(500)]
                                 + [b"after-%d" % i for i in range(500)])
    through = toxiproxy.bytes_through(proxy) - bytes_before
    assert through > 500 * len(b"after-000"), \
        f"the new leader's records did not pass its proxy ({through} bytes)"
    fault_report(f"node {leader} killed: {topic}-0's leader moved to node {moved}; "
                 f"{through} bytes through {proxy} since")
    kafka_cluster.restart(leader)

    def isr() -> list[int]:
        md = kafka_cluster.admin().list_topics(topic=topic, timeout=10).topics[topic]
        return sorted(md.partitions[0].isrs)

    wait_for(isr, lambda nodes: leader in nodes, 60, f"node {leader} back in {topic}-0's ISR")


@pytest.mark.broker
@pytest.mark.brokers
def test_the_cli_runs_a_three_broker_cluster() -> None:
    """``kafka-share broker --brokers 3 --topic orders:3`` prints every node's address, and
    its topic is replicated to the three."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyspark_kafka_share.cli", "broker", "--brokers", "3",
         "--topic", "orders:3"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.count(",") == 2, f"not three addresses: {line!r}"
        from confluent_kafka.admin import AdminClient

        md = AdminClient({"bootstrap.servers": line}).list_topics(topic="orders", timeout=30)
        assert sorted(md.brokers) == [1, 2, 3]
        assert all(sorted(p.replicas) == [1, 2, 3]
                   for p in md.topics["orders"].partitions.values())
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=120) == 0
