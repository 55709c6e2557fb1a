"""The kafka-share source with its exactly-once journal on the three-broker cluster, through a
partition leader killed mid-stream, a broker blackholed (for clients) past the share session
timeout, a rolling restart, and latency, connection resets and a slow drip on a leader's link.
Each test shows its fault happened (the leader moved; the proxy's byte counters grew while the
toxic was on) and ends with the Parquet sink holding every record exactly once and the share
group holding nothing more."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import AcknowledgeType, ShareConsumer
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from pyspark_kafka_share.harness import LocalKafka, LocalKafkaCluster, ProducerRecord, Toxiproxy
from tests.brokers.network import RowsRead, check_hits, run_network_faults
from tests.chaos.chaos_harness import SteadyProducer
from tests.fixtures.brokers import ClusterTopicFactory
from tests.helpers import (
    Key,
    assert_exactly_once,
    poll_share,
    produce_spread,
    record_key,
    share_stream,
    sink_keys,
    start_parquet,
)

N = 9_000  # records over 3 partitions
PER_TRIGGER = 500  # a stream of many micro-batches, so the fault falls mid-stream
LOCK_MS = 8_000


def _nothing_left(kafka: LocalKafkaCluster, group: str, topic: str) -> None:
    c = ShareConsumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group,
                       "share.acknowledgement.mode": "explicit"})
    try:
        c.subscribe([topic])
        left = [record_key(m) for m in poll_share(c, AcknowledgeType.RELEASE, timeout_s=8)]
    finally:
        c.close()
    assert left == [], f"{len(left)} records still in the group, e.g. {left[:3]}"


def _stream(spark: SparkSession, broker: LocalKafka, topic: str, group: str,
            tmp_path: Path) -> StreamingQuery:
    df = share_stream(spark, broker, [topic], group, tmp_path / "journal", numPartitions=3,
                      maxRecordsPerTrigger=PER_TRIGGER)
    return start_parquet(df, tmp_path / "out", tmp_path / "chk")


def _spread_and_stream(spark: SparkSession, kafka: LocalKafkaCluster, broker: LocalKafka,
                       topic: str, group: str, tmp_path: Path) -> tuple[set[Key], StreamingQuery]:
    """The group's lock shortened to LOCK_MS, N records spread over the topic's 3 partitions
    (their keys: what the sink must hold), and the query reading them."""
    kafka.set_group_config(group, "share.record.lock.duration.ms", LOCK_MS)
    expected = produce_spread(broker, topic, 3, N)
    return expected, _stream(spark, broker, topic, group, tmp_path)


@pytest.mark.brokers_ci
def test_source_exactly_once_when_a_busy_partitions_leader_is_killed(
    spark: SparkSession, kafka_cluster: LocalKafkaCluster, cluster_broker: LocalKafka,
    toxiproxy: Toxiproxy, cluster_topic_factory: ClusterTopicFactory, cluster_group: str,
    tmp_path: Path, fault_report: Callable[[str], None],
) -> None:
    topic = cluster_topic_factory(3)
    expected, q = _spread_and_stream(spark, kafka_cluster, cluster_broker, topic, cluster_group,
                                     tmp_path)
    rows = RowsRead(q)
    try:
        rows.until(2 * PER_TRIGGER, 180, "before the kill")
        leader = kafka_cluster.leader(topic, 0)
        coordinator = kafka_cluster.group_coordinator(cluster_group)
        read_at_kill = rows()
        kafka_cluster.kill(leader)
        moved = kafka_cluster.wait_for_leader(topic, 0, not_on={leader})
        proxy = kafka_cluster.proxy_name(moved)
        through_before = toxiproxy.bytes_through(proxy)
        rows.until(N, 300, "after the kill")
        through = toxiproxy.bytes_through(proxy) - through_before
        coordinator_after = kafka_cluster.group_coordinator(cluster_group)
    finally:
        q.stop()
    fault_report(f"node {leader} (leader of {topic}-0; group coordinator: node {coordinator}) "
                 f"killed after {read_at_kill} of {N} rows; {topic}-0's leader moved to node "
                 f"{moved}, the group coordinator is node {coordinator_after}; {through} bytes "
                 f"through {proxy} since")
    assert coordinator_after != leader, "the group is still coordinated by the killed node"
    assert read_at_kill < N, "the query read everything before the kill: nothing was proven"
    assert through > 0, f"no client traffic reached the new leader through {proxy}"
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)
    _nothing_left(kafka_cluster, cluster_group, topic)


def test_source_exactly_once_when_the_coordinator_is_blackholed_past_the_session_timeout(
    spark: SparkSession, kafka_cluster: LocalKafkaCluster, cluster_broker: LocalKafka,
    toxiproxy: Toxiproxy, cluster_topic_factory: ClusterTopicFactory, cluster_group: str,
    tmp_path: Path, fault_report: Callable[[str], None],
) -> None:
    """The share group's coordinator (also a leader of some partitions) stays up for the other
    brokers but swallows every client byte, both ways, for twice the session timeout."""
    topic = cluster_topic_factory(3)
    expected, q = _spread_and_stream(spark, kafka_cluster, cluster_broker, topic, cluster_group,
                                     tmp_path)
    rows = RowsRead(q)
    try:
        rows.until(2 * PER_TRIGGER, 180, "before the blackhole")
        node = kafka_cluster.group_coordinator(cluster_group)
        leaders = {p: kafka_cluster.leader(topic, p) for p in range(3)}
        proxy = kafka_cluster.proxy_name(node)
        read_before = rows()
        toxiproxy.blackhole(proxy)
        swallowed_from = toxiproxy.bytes_through(proxy, "upstream")
        time.sleep(2 * 6.0)  # the fault itself: 2 x the cluster's 6 s session timeout
        swallowed = toxiproxy.bytes_through(proxy, "upstream") - swallowed_from
        toxiproxy.remove_toxics(proxy)
        read_during = rows() - read_before
        rows.until(N, 300, "after the blackhole")
    finally:
        q.stop()
    fault_report(f"node {node} (group coordinator; leaders {leaders}) blackholed 12 s after "
                 f"{read_before} of {N} rows: {swallowed} client bytes swallowed, "
                 f"{read_during} rows read meanwhile")
    assert read_before < N, "the query read everything before the fault: nothing was proven"
    assert swallowed > 0, "no client sent a byte to the blackholed broker: the toxic was not hit"
    assert kafka_cluster.group_coordinator(cluster_group) == node, \
        "a client-side blackhole moved the coordinator: the brokers saw it too"
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)
    _nothing_left(kafka_cluster, cluster_group, topic)


def _feed(kafka: LocalKafka, topic: str, stop: threading.Event,
          produced: Counter[int], errors: list[BaseException]) -> None:
    """Produce 90 records a second over 3 partitions until ``stop`` (counting them per
    partition: the idempotent producer writes each once, so partition p holds offsets
    0..produced[p]-1)."""
    i = 0
    try:
        while not stop.is_set():
            kafka.produce(topic, [ProducerRecord(value=b"w%d" % (i + j), partition=(i + j) % 3)
                                  for j in range(90)])
            produced.update((i + j) % 3 for j in range(90))
            i += 90
            stop.wait(1.0)
    except BaseException as exc:  # noqa: BLE001 - handed to the test
        errors.append(exc)


def test_source_exactly_once_through_a_rolling_restart_of_all_three_brokers(
    spark: SparkSession, kafka_cluster: LocalKafkaCluster, cluster_broker: LocalKafka,
    cluster_topic_factory: ClusterTopicFactory, cluster_group: str, tmp_path: Path,
    fault_report: Callable[[str], None],
) -> None:
    """Each node in turn stopped cleanly (SIGTERM) and started on its data, as an operator
    rolls a cluster, while a producer writes and the query reads: each restart waits until the
    node is back in the cluster's metadata before the next one goes."""
    topic = cluster_topic_factory(3)
    kafka_cluster.set_group_config(cluster_group, "share.record.lock.duration.ms", LOCK_MS)
    produced: Counter[int] = Counter()
    errors: list[BaseException] = []
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(cluster_broker, topic, stop, produced, errors))
    feeder.start()
    q = _stream(spark, cluster_broker, topic, cluster_group, tmp_path)
    rolled: list[str] = []
    rows = RowsRead(q)
    try:
        rows.until(2 * PER_TRIGGER, 180, "before the rolling restart")
        for node in kafka_cluster.node_ids:
            led = [p for p in range(3) if kafka_cluster.leader(topic, p) == node]
            rolled.append(f"node {node} (led {led}) at {rows()} rows read of "
                          f"{sum(produced.values())} produced")
            kafka_cluster.restart(node)
    finally:
        stop.set()
        feeder.join(120)
    try:
        assert not errors, f"the producer failed during the roll: {errors[0]!r}"
        total = sum(produced.values())
        read_at_end = rows()
        rows.until(total, 300, "after the rolling restart")
    finally:
        q.stop()
    fault_report(f"rolled {'; '.join(rolled)}; {read_at_end} of {total} rows read when the "
                 "last node was back")
    assert read_at_end < total, "the query had read everything before the roll ended"
    expected = {(topic, p, o) for p, n in produced.items() for o in range(n)}
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)
    _nothing_left(kafka_cluster, cluster_group, topic)


def test_source_exactly_once_through_latency_resets_and_a_slow_drip_on_a_leaders_link(
    spark: SparkSession, kafka_cluster: LocalKafkaCluster, cluster_broker: LocalKafka,
    toxiproxy: Toxiproxy, cluster_topic_factory: ClusterTopicFactory, cluster_group: str,
    tmp_path: Path, fault_report: Callable[[str], None],
) -> None:
    """A producer writes 90 records a second (through the proxies too) while the query reads;
    partition 0's leader's client link gets 500 ms of latency each way, then connections reset
    300 ms into their responses (fetches and acknowledgements cut mid-way), then a slow drip,
    each for seconds; the stream resumes after each."""
    topic = cluster_topic_factory(3)
    kafka_cluster.set_group_config(cluster_group, "share.record.lock.duration.ms", LOCK_MS)
    producer = SteadyProducer(kafka_cluster.bootstrap_servers, topic, 3, 90.0, 1)
    producer.start()
    q = _stream(spark, cluster_broker, topic, cluster_group, tmp_path)
    rows = RowsRead(q)
    try:
        rows.until(2 * PER_TRIGGER, 180, "before the faults")
        node = kafka_cluster.leader(topic, 0)
        hits = run_network_faults(toxiproxy, kafka_cluster.proxy_name(node), rows)
    finally:
        producer.finish()
        producer.join(300)
    try:
        total = len(producer.delivered)
        rows.until(total, 300, "after the faults")
    finally:
        q.stop()
    check_hits(hits, f"node {node} (leader of {topic}-0)",
               f"{total} records produced, {rows()} rows read", producer.errors, fault_report)
    expected = {(topic, p, o) for p, o in producer.delivered.values()}
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)
    _nothing_left(kafka_cluster, cluster_group, topic)
