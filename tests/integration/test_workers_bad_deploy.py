"""A bad deploy never empties the queue (issue 35), on a real broker and local Spark.

Each scenario of the issue with 4,000 records: an output value without ``output_topic`` (a
configuration mistake), a bug raising on every record without and with a dead-letter topic
(the circuit breaker). Each must fail with a named cause, and at most 5% of the records may be
rejected, archived or dead-lettered: what a fresh member of the group drains afterwards is
counted. Also the WARNING at start when a REJECT archives for good, and the honest ending of a
killed Python worker on a master that retries nothing (in a process of its own: a process
holds one SparkContext, and the ``spark`` fixture's master retries).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share.errors import CircuitBreakerError, ConfigurationMistakeError
from pyspark_kafka_share.harness import LocalKafka
from pyspark_kafka_share.workers import Record, Result, run_workers, start_workers
from tests.fixtures.kafka import ShareConsumerFactory, TopicFactory
from tests.helpers import poll_share, stop_when_drained

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

N = 4_000
MAX_LOST = N * 5 // 100  # the target: at most 5% rejected, archived or dead-lettered


def _queue(kafka: LocalKafka, topic_factory: TopicFactory) -> str:
    src = topic_factory(2)
    kafka.produce(src, [f"{i}".encode() for i in range(N)])
    return src


def _left_in_queue(share_consumer: ShareConsumerFactory, group: str, src: str) -> set[bytes]:
    """The distinct records a fresh member of ``group`` still gets (ACCEPTing them)."""
    got = poll_share(share_consumer(group, [src]), timeout_s=120, quiet_s=10,
                     until=lambda seen: len({m.value() for m in seen}) >= N)
    return {m.value() or b"" for m in got}


def _common(kafka: LocalKafka, src: str, group: str) -> dict[str, Any]:
    return {"topics": src, "group": group, "bootstrap_servers": kafka.bootstrap_servers,
            "workers": 2, "idle_timeout_s": 20, "on_progress": False}


def test_an_output_without_output_topic_fails_at_once_and_releases(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
    share_consumer: ShareConsumerFactory,
) -> None:
    src = _queue(kafka, topic_factory)
    with pytest.raises(ConfigurationMistakeError, match=r"'output_topic'.*pass output_topic=") \
            as caught:
        run_workers(spark, lambda r: Result.accept(r.value), **_common(kafka, src, group))
    summary = caught.value.summary
    assert caught.value.option == "output_topic"
    assert summary.stop_reason == "configuration mistake", str(summary)
    assert summary.totals["rejected"] == summary.totals["dead_lettered"] == 0, str(summary)
    assert summary.totals["accepted"] == 0 and summary.totals["processed"] <= 2 * 100
    assert len(_left_in_queue(share_consumer, group, src)) == N  # nothing archived


@pytest.mark.parametrize("with_dlq", [False, True])
def test_a_bug_on_every_record_trips_the_breaker(
    with_dlq: bool, kafka: LocalKafka, topic_factory: TopicFactory, group: str,
    spark: SparkSession, share_consumer: ShareConsumerFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    src = _queue(kafka, topic_factory)
    dlq = topic_factory(1) if with_dlq else None

    def buggy(rec: Record) -> None:
        raise KeyError("no such field")

    caplog.set_level(logging.WARNING, logger="pyspark_kafka_share.workers")
    with pytest.raises(CircuitBreakerError, match="failed with KeyError") as caught:
        run_workers(spark, buggy, **_common(kafka, src, group), dead_letter_topic=dlq,
                    retry_on=(TimeoutError,))
    warned = [r.getMessage() for r in caplog.records if "archived by the broker for good" in
              r.getMessage()]
    # The start WARNING: only when a REJECT archives for good (no dead-letter topic).
    assert len(warned) == (0 if with_dlq else 1), warned
    if not with_dlq:
        assert repr(group) in warned[0] and "dead_letter_topic=" in warned[0]
    summary = caught.value.summary
    t = summary.totals
    assert summary.stop_reason == "circuit breaker", str(summary)
    assert t["rejected"] + t["dead_lettered"] <= MAX_LOST, str(summary)
    left = _left_in_queue(share_consumer, group, src)
    assert len(left) >= N - MAX_LOST, (len(left), str(summary))
    if dlq is not None:
        dead = poll_share(share_consumer(f"{group}-dlq", [dlq]), quiet_s=5, timeout_s=30)
        assert len(dead) <= MAX_LOST


def test_a_breaker_turned_off_rejects_as_before(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
) -> None:
    src = topic_factory(1)
    kafka.produce(src, [f"{i}".encode() for i in range(50)])

    def buggy(rec: Record) -> None:
        raise KeyError("no such field")

    job = start_workers(spark, buggy, **{**_common(kafka, src, group), "workers": 1,
                                             "idle_timeout_s": None}, circuit_breaker=None)
    # Done once all 50 are settled for good and counted (not on a 6 s idle timeout, which a
    # slow task start outlasts on a loaded machine).
    summary = stop_when_drained(job, kafka, group,
                                settled=lambda: job.progress().totals["rejected"] >= 50)
    assert summary.totals["rejected"] == 50 and summary.stop_reason == "the test is done"


_KILLED_ON_LOCAL_N = textwrap.dedent("""
    import json, sys
    from pyspark import cloudpickle
    from pyspark_kafka_share.errors import SparkGaveUpError
    from pyspark_kafka_share.harness import local_spark
    from pyspark_kafka_share.workers import run_workers
    import tests.helpers as helpers
    cloudpickle.register_pickle_by_value(helpers)
    bootstrap, src, out, group, log, killed = sys.argv[1:7]
    spark = local_spark("local[2]", "kafka-share-killed-on-local-n")
    try:
        run_workers(spark, helpers.worker_dies_once(log, killed), topics=src, group=group,
                    bootstrap_servers=bootstrap, workers=2, chunk_size=20, idle_timeout_s=15,
                    output_topic=out, on_progress=False)
        print(json.dumps({"error": None}))
    except SparkGaveUpError as exc:
        print(json.dumps({"error": str(exc), "lost": len(exc.summary.failed_attempts)}))
    finally:
        spark.stop()
""")


def test_a_killed_worker_on_a_master_that_retries_nothing_ends_honestly(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, tmp_path: Path,
) -> None:
    src, out = topic_factory(2), topic_factory(1)
    kafka.produce(src, [f"{i}".encode() for i in range(400)])
    log, killed = str(tmp_path / "calls.jsonl"), str(tmp_path / "killed")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root / "src"), str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _KILLED_ON_LOCAL_N, kafka.bootstrap_servers,
                           src, out, group, log, killed], capture_output=True, text=True,
                          timeout=600, env=env, cwd=root, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert lines, done.stderr[-3000:]
    result = json.loads(lines[-1])
    error = result["error"]
    assert error is not None, "the job did not fail on local[2]"
    first, rest = error.split("\n", 1)
    assert first.startswith("Spark gave up on a worker task after 1 failed attempt(s) on "
                            "master local[2]: it retries nothing: use a master that does, "
                            "e.g. local[N, 4]"), first
    assert "kafka-share workers stopped" in rest and "attempt(s) died" in rest, rest
    assert "record(s) they held then is not known" in rest and result["lost"] >= 1
