"""The object-store fault proxy (harness/s3_faults.py) in front of LocalS3, and the source's
journal on S3 through it on the three-broker cluster: 503 SlowDown, 500, a conditional PUT
applied and answered 500, and stalls; the store down for 8 s (the query rides it out within
journalRetryTimeoutMs) and down past that bound (the query fails naming the store, the call
and the option; restarted once the store is back, it ends exactly once). Each stream ends
with every record once in the sink."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from pyspark_kafka_share.harness import LocalKafka, LocalKafkaCluster, LocalS3
from pyspark_kafka_share.harness.s3_faults import S3FaultProxy, S3Faults
from tests.brokers.network import RowsRead
from tests.chaos.chaos_harness import SteadyProducer
from tests.fixtures.brokers import ClusterTopicFactory
from tests.fixtures.journal import BUCKET
from tests.helpers import (
    OptionValue,
    assert_exactly_once,
    drain_available_now,
    produce_spread,
    run_available_now,
    share_stream,
    sink_keys,
    start_parquet,
)


@pytest.fixture
def s3_proxy(s3: LocalS3) -> Iterator[S3FaultProxy]:
    with S3FaultProxy(s3.endpoint_url, seed=37) as proxy:
        yield proxy


def _client(proxy: S3FaultProxy, s3: LocalS3) -> Any:
    import boto3  # type: ignore[import-untyped]  # installed with moto
    from botocore.config import Config  # type: ignore[import-untyped]

    return boto3.client("s3", endpoint_url=proxy.endpoint_url, region_name=s3.region,
                        aws_access_key_id="testing", aws_secret_access_key="testing",
                        config=Config(retries={"total_max_attempts": 1}))  # no retry


@pytest.mark.brokers_ci
@pytest.mark.brokers
def test_the_fault_proxy_answers_as_a_failing_s3(s3: LocalS3, s3_proxy: S3FaultProxy) -> None:
    from botocore.exceptions import ClientError  # type: ignore[import-untyped]

    client = _client(s3_proxy, s3)
    key = f"faults/{uuid.uuid4().hex}"
    client.put_object(Bucket=BUCKET, Key=key + "/plain", Body=b"x")  # no fault: forwarded
    s3_proxy.faults = S3Faults(slow_down=1.0)
    with pytest.raises(ClientError, match="SlowDown"):
        client.get_object(Bucket=BUCKET, Key=key + "/plain")
    s3_proxy.faults = S3Faults(applied_then_500=1.0)
    with pytest.raises(ClientError, match="InternalError"):
        client.put_object(Bucket=BUCKET, Key=key + "/cond", Body=b"y", IfNoneMatch="*")
    s3_proxy.faults = S3Faults()
    assert client.get_object(Bucket=BUCKET, Key=key + "/cond")["Body"].read() == b"y", \
        "the conditional PUT answered 500 was not applied"
    with pytest.raises(ClientError, match="PreconditionFailed"):  # the retry meets its own
        client.put_object(Bucket=BUCKET, Key=key + "/cond", Body=b"y", IfNoneMatch="*")
    s3_proxy.faults = S3Faults(stall=1.0, stall_s=1.5)
    started = time.monotonic()
    client.head_object(Bucket=BUCKET, Key=key + "/plain")
    assert time.monotonic() - started >= 1.5
    assert s3_proxy.counts["slow_down"] == 1 and s3_proxy.counts["stall"] == 1
    assert s3_proxy.counts["applied_then_500:200"] == 1


def test_the_journal_on_s3_through_503s_500s_and_stalls_is_exactly_once(
    spark: SparkSession, kafka_cluster: LocalKafkaCluster, cluster_broker: LocalKafka,
    cluster_topic_factory: ClusterTopicFactory, cluster_group: str, s3: LocalS3,
    s3_proxy: S3FaultProxy, tmp_path: Path, fault_report: Callable[[str], None],
) -> None:
    topic = cluster_topic_factory(3)
    expected = produce_spread(cluster_broker, topic, 3, 3000)
    s3_proxy.faults = S3Faults(slow_down=0.10, internal_error=0.05, applied_then_500=0.5,
                               stall=0.05, stall_s=2.0)
    options = {**s3.journal_options(), "journal.aws_endpoint": s3_proxy.endpoint_url,
               "journalPath": f"s3://{BUCKET}/faults-{uuid.uuid4().hex}"}
    df = share_stream(spark, cluster_broker, [topic], cluster_group, None,
                      numPartitions=3, maxRecordsPerTrigger=1000, **options)
    run_available_now(df, tmp_path / "out", tmp_path / "chk", timeout_s=600)
    counts = dict(s3_proxy.counts)
    fault_report(f"journal requests through the S3 fault proxy: {counts}")
    for fault in ("slow_down", "internal_error", "stall"):
        assert counts.get(fault, 0) > 0, f"no request met {fault}: {counts}"
    assert counts.get("applied_then_500:200", 0) > 0, \
        f"no conditional PUT was applied and answered 500: {counts}"
    assert_exactly_once(sink_keys(spark, tmp_path / "out"), expected)


# The query's bound on a store outage (journalRetryTimeoutMs): the first outage (8 s) is
# within it, the second lasts until the query fails. Before the bound existed obstore gave up
# after 10 retries in 1.7-3.6 s (measured here) and a 4 s outage failed the query at the
# driver's commit or latestOffset.
RETRY_MS = 20_000
SHORT_OUTAGE_S = 8.0
# How long the query may take to fail once the store is down for good: a journal call ends
# at the bound plus obstore's last backoff (at most 5 s); the driver's next call fails the
# query, or a task's calls fail each of its 4 attempts (local[2, 4]) after as long, with its
# poll (10 s) before. A hang, not a measure.
FAIL_WITHIN_S = 4 * (RETRY_MS // 1000 + 5 + 10) + 60


def test_the_journal_store_down_is_ridden_out_within_the_bound_and_fails_the_query_past_it(
    spark: SparkSession, kafka_cluster: LocalKafkaCluster, cluster_broker: LocalKafka,
    cluster_topic_factory: ClusterTopicFactory, cluster_group: str, s3: LocalS3,
    s3_proxy: S3FaultProxy, tmp_path: Path, fault_report: Callable[[str], None],
) -> None:
    """A producer writes 90 records a second while the query reads; every journal request is
    answered 503 SlowDown for 8 s (within journalRetryTimeoutMs=20000: the query keeps
    running and reads on), then until the query fails, after the bound, with a
    JournalUnavailable naming the bucket and the option. Restarted from its checkpoint and
    journal once the store is back, the query ends with every record once in the sink: no
    record was ACCEPTed without its journal slot."""
    topic = cluster_topic_factory(3)
    producer = SteadyProducer(kafka_cluster.bootstrap_servers, topic, 3, 90.0, 1)
    options: dict[str, OptionValue] = {
        **s3.journal_options(), "journal.aws_endpoint": s3_proxy.endpoint_url,
        "journalPath": f"s3://{BUCKET}/down-{uuid.uuid4().hex}", "numPartitions": 3,
        "journalRetryTimeoutMs": RETRY_MS}
    out, chk = tmp_path / "out", tmp_path / "chk"
    producer.start()
    q = start_parquet(share_stream(spark, cluster_broker, [topic], cluster_group, None,
                                   **options), out, chk)
    rows = RowsRead(q)
    try:
        rows.until(400, 180, "before the outage")
        short_from, refused = rows(), s3_proxy.counts["down"]
        s3_proxy.faults = S3Faults(down=True)
        time.sleep(SHORT_OUTAGE_S)  # the fault itself: the store down for 8 s
        s3_proxy.faults = S3Faults()
        refused = s3_proxy.counts["down"] - refused
        rows.until(rows() + 200, 180, "after the short outage")
        survived = q.isActive and q.exception() is None
        long_from, refused_long = rows(), s3_proxy.counts["down"]
        s3_proxy.faults = S3Faults(down=True)
        began = time.monotonic()
        with contextlib.suppress(StreamingQueryException):  # the failure: checked below
            q.awaitTermination(FAIL_WITHIN_S)
        failed_after = time.monotonic() - began
    finally:
        s3_proxy.faults = S3Faults()
        q.stop()
        producer.finish()
        producer.join(300)
    refused_long = s3_proxy.counts["down"] - refused_long
    error = str(q.exception())
    fault_report(f"store down {SHORT_OUTAGE_S:.0f} s at {short_from} rows: {refused} requests "
                 f"refused, the query read on; down again at {long_from} rows: the query "
                 f"failed after {failed_after:.0f}s and {refused_long} refused requests: "
                 f"{error.splitlines()[0][:300] if error else error}")
    assert refused > 0, "no journal request met the short outage"
    assert survived, "the query did not ride out the short outage"
    assert q.exception() is not None, f"the query did not fail within {FAIL_WITHIN_S}s"
    assert failed_after >= RETRY_MS / 1000, \
        f"the query failed after {failed_after:.0f}s, before journalRetryTimeoutMs"
    assert "JournalUnavailable" in error and f"s3://{BUCKET}" in error, error[:2000]
    assert f"journalRetryTimeoutMs={RETRY_MS}" in error, error[:2000]
    expected = {(topic, p, o) for p, o in producer.delivered.values()}
    drain_available_now(spark, share_stream(spark, cluster_broker, [topic], cluster_group, None,
                                            **options), out, chk, expected, timeout_s=600)
    assert_exactly_once(sink_keys(spark, out), expected)
