"""Every Apache Kafka line with share groups (docs/compatibility.md).

The session's broker runs ``$PYSPARK_KAFKA_SHARE_KAFKA_VERSION`` (``make test-versions`` runs
this file with the admin, CLI, source and workers subset on 4.2.2 and 4.3.1, ``make test`` on
the newest): what it negotiates and reports is checked against what that line is known to offer.
The rolling upgrade restarts a broker of the oldest line onto the newest (same data, cluster
id and ports) under an exactly-once query and queue workers, then raises ``share.version``
with Kafka's feature tool.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle

from pyspark_kafka_share import cli
from pyspark_kafka_share._kafka.dlq import DLQ_TOPIC_ENABLE
from pyspark_kafka_share._kafka.group import inspect_broker
from pyspark_kafka_share._kafka.protocol import KafkaProtocolClient
from pyspark_kafka_share._kafka.protocol.codec import API_SPECS, ApiKey
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share.admin import ShareGroupAdmin
from pyspark_kafka_share.errors import BrokerError, OptionError
from pyspark_kafka_share.harness import KAFKA_VERSIONS, LocalKafka, ProducerRecord
from pyspark_kafka_share.workers import Record, Result, run_workers, start_workers
from pyspark_kafka_share.workers.config import CLIENTS, ShareClient
from tests.helpers import read_topic, stop_when_drained, wait_for

# Every test here is in the Kafka subset (make test-kafka-versions, test-versions).
pytestmark = pytest.mark.kafka_subset

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

UPGRADE_FROM = os.environ.get("KAFKA_UPGRADE_FROM", KAFKA_VERSIONS[0])
UPGRADE_TO = os.environ.get("KAFKA_UPGRADE_TO", KAFKA_VERSIONS[-1])


def _line(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def _features(kafka: LocalKafka) -> dict[str, int]:
    with KafkaProtocolClient(kafka.bootstrap_servers, timeout_s=30) as client:
        features = client.finalized_features()
    assert features is not None, "the broker reports no feature levels (ApiVersions v3+)"
    return features


def test_the_broker_line_negotiates_every_api_the_client_sends(kafka: LocalKafka) -> None:
    with KafkaProtocolClient(kafka.bootstrap_servers, timeout_s=30) as client:
        client.brokers()  # one connection, negotiated
        conn = next(iter(client._conns.values()))
        chosen = {key: conn.version_for(key) for key in API_SPECS}
    assert chosen[ApiKey.SHARE_GROUP_DESCRIBE] == 1
    assert chosen[ApiKey.DESCRIBE_SHARE_GROUP_OFFSETS] == 1  # lag is reported
    assert chosen[ApiKey.API_VERSIONS] >= 3  # feature levels are reported


def test_the_broker_line_reports_its_share_version(kafka: LocalKafka) -> None:
    """A freshly formatted broker finalizes its release's share.version: 1 up to 4.3, 2 (the
    broker's dead-letter queue, KIP-1191) from 4.4."""
    expected = 2 if _line(kafka.version) >= (4, 4) else 1
    assert _features(kafka)["share.version"] == expected
    described = kafka.run_tool("FeatureCommand", "--bootstrap-server", kafka.bootstrap_servers,
                               "describe").stdout
    share = next(line for line in described.splitlines() if "share.version" in line)
    assert f"FinalizedVersionLevel: {expected}" in " ".join(share.split())


def _sink(spark: Any, out: Path) -> list[tuple[str, int, int]]:
    try:
        rows = spark.read.parquet(str(out)).select("topic", "partition", "offset").collect()
    except Exception:  # noqa: BLE001 - no file yet
        return []
    return [(r.topic, r.partition, r.offset) for r in rows]


def _written(spark: Any, out: Path, query: Any) -> int:
    """Rows in the query's sink; the query's own error at once if it failed."""
    if query.exception() is not None:
        raise AssertionError(f"the query failed: {query.exception()}")
    return len(_sink(spark, out))


def _produce(kafka: LocalKafka, topics: list[str], start: int, n: int) -> None:
    for topic in topics:
        kafka.produce(topic, [ProducerRecord(value=b"%d" % i, partition=i % 2)
                              for i in range(start, start + n)])


def _echo(rec: Record) -> bytes:
    time.sleep(0.002)
    return rec.value or b""


@pytest.mark.kafka_upgrade
@pytest.mark.skipif("KAFKA_UPGRADE_FROM" not in os.environ,
                    reason="a broker of its own for two minutes: make test-versions runs it")
@pytest.mark.parametrize("client", CLIENTS)
def test_rolling_upgrade_under_load_loses_and_duplicates_nothing(
    spark: Any, tmp_path: Path, client: ShareClient,
) -> None:
    """A broker of the old line stopped and started on the new one while an exactly-once query
    and a queue worker (on each share client in turn: issue 38 asks the native client through
    a rolling upgrade) run; the binaries alone change no feature level."""
    n = 600
    with LocalKafka(version=UPGRADE_FROM, lock_duration_ms=15_000) as kafka:
        q_topic, w_topic = kafka.create_topic("upgrade-q", 2), kafka.create_topic("upgrade-w", 2)
        out_topic = kafka.create_topic("upgrade-out", 1)
        for group in ("upgrade-query", "upgrade-workers"):
            kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
        _produce(kafka, [q_topic, w_topic], 0, n)
        out = tmp_path / "out"
        query = (spark.readStream.format("kafka-share")
                 .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
                 .option("kafka.group.id", "upgrade-query").option("subscribe", q_topic)
                 .option("journalPath", str(tmp_path / "journal"))
                 .option("maxRecordsPerTrigger", 200).option("pollTimeoutMs", 1500).load()
                 .writeStream.format("parquet").option("path", str(out))
                 .option("checkpointLocation", str(tmp_path / "chk"))
                 .trigger(processingTime="1 second").start())
        job = start_workers(spark, _echo, topics=[w_topic], group="upgrade-workers",
                            bootstrap_servers=kafka.bootstrap_servers, workers=1,
                            chunk_size=20, output_topic=out_topic, on_progress=False,
                            client=client)
        try:
            wait_for(lambda: _written(spark, out, query), lambda c: c > 0, 120, "a first batch")
            kafka.restart(version=UPGRADE_TO)  # graceful stop of the old release, same data
            assert kafka.version == UPGRADE_TO
            assert _features(kafka)["share.version"] == 1  # binaries alone change no feature
            _produce(kafka, [q_topic, w_topic], n, n)
            wait_for(lambda: _written(spark, out, query), lambda c: c >= 2 * n, 240,
                     "every record in the query's sink")
            outputs = read_topic(kafka, out_topic, 2 * n, timeout_s=240)
        finally:
            query.stop()
            summary = job.stop("test over")
        assert query.exception() is None
        got = _sink(spark, out)
        dups = [k for k, c in Counter(got).items() if c > 1]
        assert not dups, f"the query wrote {len(dups)} records twice, e.g. {dups[:3]}"
        assert set(got) == {(q_topic, p, o) for p in (0, 1) for o in range(n)}
        # The workers are at-least-once (docs/workers.md): a record whose ACCEPT the stopping
        # broker never confirmed comes back; none may be missing.
        values = Counter((m.value() or b"").decode() for m in outputs)
        assert set(values) == {str(i) for i in range(2 * n)}, "the workers lost records"
        assert summary is not None and summary.totals["processed"] >= 2 * n
        print(f"upgrade {UPGRADE_FROM} -> {UPGRADE_TO} ({client}): "
              f"{sum(values.values()) - 2 * n} worker outputs written again after a redelivery")

        raised = kafka.run_tool("FeatureCommand", "--bootstrap-server", kafka.bootstrap_servers,
                                "upgrade", "--feature", "share.version=2")
        assert "share.version was upgraded to 2" in raised.stdout
        assert _features(kafka)["share.version"] == 2


# -- the broker's dead-letter queue (KIP-1191, Kafka 4.4+) -------------------------------------


def _dlq_cli(kafka: LocalKafka, capsys: pytest.CaptureFixture[str], *args: str) -> \
        tuple[int, str]:
    capsys.readouterr()
    code = cli.main(["groups", "dlq", *args, "--bootstrap-server", kafka.bootstrap_servers,
                     "--timeout", "20"])
    return code, capsys.readouterr().out


def test_the_cli_shows_whether_the_broker_dead_letters(
    kafka: LocalKafka, group: str, capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = _dlq_cli(kafka, capsys, group, "--json")
    shown = json.loads(out)
    assert code == 0
    assert shown["supported"] is (_line(kafka.version) >= (4, 4))
    assert (shown["active"], shown["topic"]) == (False, None)


def _poison(rec: Record) -> Result:
    if (rec.value or b"").startswith(b"poison"):
        return Result.reject("unparseable")
    return Result.accept()


def test_a_reject_lands_once_in_the_brokers_dead_letter_topic(
    kafka: LocalKafka, topic_factory: Callable[..., str], group: str, spark: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if _line(kafka.version) < (4, 4):
        pytest.skip(f"Apache Kafka {kafka.version} has no dead-letter queue (4.4.0+ has)")
    src, own_dlq = topic_factory(2), topic_factory(1)
    dlq_topic = kafka.create_topic(f"dlq.{group}", 1, {DLQ_TOPIC_ENABLE: "true"})
    kafka.produce(src, [ProducerRecord(value=f"{kind}-{i}".encode(), partition=i % 2)
                        for i in range(10) for kind in ("ok", "poison")])
    code, out = _dlq_cli(kafka, capsys, group, "--topic", dlq_topic, "--dry-run")
    assert code == 0 and "plan only" in out and "is off" in out
    code, out = _dlq_cli(kafka, capsys, group, "--topic", dlq_topic, "--execute")
    assert code == 0 and f"on: REJECTed records go to {dlq_topic!r}" in out
    options: dict[str, Any] = {"topics": [src], "group": group,
                               "bootstrap_servers": kafka.bootstrap_servers,
                               "workers": 1, "on_progress": False}
    with pytest.raises(OptionError, match=rf"dead_letter_topic.*{own_dlq}.*twice"):
        run_workers(spark, _poison, dead_letter_topic=own_dlq, **options)

    # Stopped once all 20 are acknowledged (not a 6 s idle timeout: a loaded machine outlasts it).
    summary = stop_when_drained(start_workers(spark, _poison, **options), kafka, group)

    assert (summary.totals["accepted"], summary.totals["rejected"]) == (10, 10), str(summary)
    assert summary.broker_dead_letter_topic == dlq_topic
    assert f"the broker dead-lettered the 10 rejected to {dlq_topic!r}" in str(summary)
    dead = read_topic(kafka, dlq_topic, 10, timeout_s=60)
    origins = Counter((h["__dlq.errors.partition"], h["__dlq.errors.offset"])
                      for h in (dict(m.headers() or []) for m in dead))
    assert sorted(origins.values()) == [1] * 10, f"not each REJECT once: {origins}"
    assert all(dict(m.headers() or [])["__dlq.errors.topic"] == src.encode() for m in dead)
    assert read_topic(kafka, own_dlq, 0, timeout_s=5) == []


# -- the delivery limit: a group config from 4.3, the broker's alone on 4.2 --------------------


def test_the_delivery_limit_is_the_groups_or_on_4_2_the_brokers(
    kafka: LocalKafka, topic: str, group: str,
) -> None:
    if _line(kafka.version) >= (4, 3):
        kafka.set_group_config(group, "share.delivery.count.limit", 3)
        facts = inspect_broker(ClientSettings(kafka.bootstrap_servers, group_id=group), [topic])
        assert facts.delivery_limit == 3
        return
    with ShareGroupAdmin(kafka.bootstrap_servers) as admin, \
            pytest.raises(BrokerError, match=r"share\.delivery\.count\.limit"):
        admin.set_config(group, "share.delivery.count.limit", 3)  # no such group config
    with LocalKafka(version=kafka.version, delivery_count_limit=3) as own:
        own_topic = own.create_topic("limited", 1)
        facts = inspect_broker(ClientSettings(own.bootstrap_servers, group_id="limited"),
                               [own_topic])
    assert facts.delivery_limit == 3  # the broker's group.share.delivery.count.limit
