"""The source's journal on S3 down for 8 s while a query reads (one broker): every journal
request is answered 503 SlowDown by the fault proxy (harness/s3_faults.py) in front of
LocalS3. Within ``journalRetryTimeoutMs`` the query rides it out, driver and tasks, and ends
with every record once in the sink. Before the bound, obstore gave up after 1.7-3.6 s and such
an outage failed the query. The outage past the bound, and the restart after it, are in
tests/brokers/test_journal_faults.py."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from pyspark_kafka_share.harness import LocalKafka, LocalS3
from pyspark_kafka_share.harness.s3_faults import S3FaultProxy, S3Faults
from tests.chaos.chaos_harness import SteadyProducer
from tests.fixtures.journal import BUCKET
from tests.fixtures.kafka import TopicFactory
from tests.helpers import (
    OptionValue,
    assert_exactly_once,
    share_stream,
    sink_keys,
    start_parquet,
    wait_for,
)

OUTAGE_S = 8.0


def _rows(q: StreamingQuery) -> int:
    """Rows the query has read (its progress reports: fewer than 100 batches here)."""
    assert q.isActive, f"the query stopped: {q.exception()}"
    return sum(int(p.get("numInputRows", 0)) for p in q.recentProgress)


def test_a_query_rides_out_a_journal_store_outage_within_the_bound(
    spark: SparkSession, kafka: LocalKafka, topic_factory: TopicFactory, group: str,
    s3: LocalS3, tmp_path: Path,
) -> None:
    topic = topic_factory(2)
    producer = SteadyProducer(kafka.bootstrap_servers, topic, 2, 50.0, 1)
    out, chk = tmp_path / "out", tmp_path / "chk"
    with S3FaultProxy(s3.endpoint_url, seed=37) as proxy:
        options: dict[str, OptionValue] = {
            **s3.journal_options(), "journal.aws_endpoint": proxy.endpoint_url,
            "journalPath": f"s3://{BUCKET}/outage-{uuid.uuid4().hex}", "numPartitions": 2,
            "maxBatchDurationMs": 2000, "journalRetryTimeoutMs": 30_000}
        producer.start()
        q = start_parquet(share_stream(spark, kafka, [topic], group, None, **options), out, chk)
        try:
            before = wait_for(lambda: _rows(q), lambda n: n >= 100, 90, "rows before the outage")
            proxy.faults = S3Faults(down=True)
            time.sleep(OUTAGE_S)  # the fault: the store answers nothing but 503 for 8 s
            proxy.faults = S3Faults()
            refused = proxy.counts["down"]
            wait_for(lambda: _rows(q), lambda n: n >= before + 100, 90, "rows after the outage")
            producer.finish()
            producer.join(60)
            expected = {(topic, p, o) for p, o in producer.delivered.values()}
            wait_for(lambda: _rows(q), lambda n: n >= len(expected), 90, "every record read")
            assert q.isActive and q.exception() is None, f"the query failed: {q.exception()}"
        finally:
            proxy.faults = S3Faults()
            producer.finish()
            q.stop()
    assert refused > 0, "no journal request met the outage"
    assert_exactly_once(sink_keys(spark, out), expected)
