"""The queue workers driven from a Spark Connect client (marker ``connect``).

The client has no SparkContext and no port the tasks can reach: the job is tagged
(``addTag``/``interruptTag``), and progress, the stop and the per-worker lease travel through the
control topic on the Kafka cluster (``workers/control_kafka.py``). What the classic tests check
(``tests/integration/test_workers.py``) holds here too: outcomes, dead letters, a graceful stop
that RELEASEs what is not processed, and a killed Python worker that loses nothing.

Worker functions run in the Connect server's Python workers on this machine, so they leave
evidence of each call in files under ``tmp_path``, which the tests read back.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share.errors import (
    CircuitBreakerError,
    ConfigurationMistakeError,
    OptionError,
)
from pyspark_kafka_share.harness import LocalKafka, ProducerRecord
from pyspark_kafka_share.workers import (
    Record,
    Result,
    WorkerSummary,
    run_workers,
    start_workers,
)
from pyspark_kafka_share.workers.control_kafka import control_topic_name
from tests.fixtures.kafka import ShareConsumerFactory, TopicFactory
from tests.helpers import (
    check_killed_worker,
    poll_share,
    read_topic,
    stop_when_drained,
    wait_for,
    worker_dies_once,
)

# The functions below run in the server's Python workers: ship this module by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]


class ServiceTimeout(Exception):
    """Transient: retry (the docs' example)."""


def _values(msgs: list[Message]) -> list[str]:
    return [(m.value() or b"").decode() for m in msgs]


def test_docs_example_with_a_graceful_stop_and_a_dead_letter_topic(
    kafka: LocalKafka, topic: str, topic_factory: TopicFactory, group: str,
    connect_spark: SparkSession, share_consumer: ShareConsumerFactory,
    connect_report: Callable[[str], None],
) -> None:
    """docs/workers.md's example from a Connect client: live progress arrives, ``job.stop()``
    lets each worker finish its chunk and RELEASE the rest, poison reaches the dead-letter
    topic; every record is in exactly one place afterwards (output, dead letter, or back in
    the queue)."""
    out, dlq = topic_factory(1), topic_factory(1)
    n = 200
    records = [ProducerRecord(key=f"k{i}".encode(),
                              value=(b"not json" if i % 10 == 0
                                     else json.dumps({"id": i}).encode()))
               for i in range(n)]
    # One producer batch: the broker hands it to one poll, so a stop finds records to RELEASE.
    kafka.produce(topic, records, producer_config={"linger.ms": "50"})

    def score(record: Record) -> Result:
        features = json.loads(record.value or b"")  # ValueError (not retryable) -> dead letter
        time.sleep(0.05)                             # the model
        return Result.accept(json.dumps({"id": features["id"], "label": features["id"] % 3}))

    job = start_workers(connect_spark, score, topics=topic, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2,
                        output_topic=out, dead_letter_topic=dlq, max_attempts=3,
                        retry_on=(ServiceTimeout,), chunk_size=5, on_progress=False,
                        progress_interval_s=0.5)
    # Live progress reaches the client through the control topic.
    seen = wait_for(lambda: job.progress().totals["processed"], lambda p: p >= 30, 90,
                    "progress from the workers over the control topic")
    summary = job.stop()
    assert isinstance(summary, WorkerSummary)
    connect_report(f"progress seen at stop: processed={seen}; {summary}")
    t = summary.totals
    assert summary.stop_reason == "stopped by user", str(summary)
    assert t["released_on_stop"] > 0 and 0 < t["accepted"] < n, str(summary)
    assert t["rejected"] == t["dead_lettered"] > 0, str(summary)
    assert {w["worker"] for w in summary.workers} == {0, 1}
    assert not summary.failed_attempts, str(summary)

    outputs = [json.loads(v)["id"] for v in _values(read_topic(kafka, out, t["accepted"]))]
    dead = read_topic(kafka, dlq, t["dead_lettered"])
    assert len(outputs) == len(set(outputs)) == t["accepted"]
    assert _values(dead) == ["not json"] * t["dead_lettered"]
    for m in dead:
        h = dict(m.headers() or [])
        assert h["kafka-share.error.type"] == b"JSONDecodeError"
        assert h["kafka-share.origin.group"] == group.encode()
    dead_ids = sorted(int((m.key() or b"k").decode()[1:]) for m in dead)
    # What the workers did not settle is back in the queue at once (RELEASEd, not locked).
    left = n - t["accepted"] - t["rejected"]
    rest = poll_share(share_consumer(group, [topic]), timeout_s=8.0,
                      until=lambda got: len(got) >= left)
    rest_ids = [int((m.key() or b"k").decode()[1:]) for m in rest]
    assert sorted(outputs + dead_ids + rest_ids) == list(range(n)), "lost or duplicated"
    # Each was RELEASEd at the stop (by the worker holding it, or by both: the other worker may
    # poll what the first released before it hears the stop itself).
    assert rest and all((m.delivery_count() or 0) >= 2 for m in rest)
    from confluent_kafka.admin import AdminClient

    topics = AdminClient({"bootstrap.servers": kafka.bootstrap_servers}).list_topics(timeout=10)
    assert len(topics.topics[control_topic_name(group)].partitions) == 2


def test_killed_worker_loses_and_duplicates_nothing(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, connect_spark: SparkSession,
    tmp_path: Path, connect_report: Callable[[str], None],
) -> None:
    """A worker's Python process dies mid-chunk (no RELEASE, no ACCEPT): Spark retries its
    task, which takes the worker's lease over once the dead attempt has been silent for
    LEASE_EXPIRY_S; the dead attempt's records come back after their lock. Every record is
    output exactly once, and the summary shows the dead attempt."""
    src, out = topic_factory(2), topic_factory(1)
    n = 300
    kafka.produce(src, [f"{i}".encode() for i in range(n)],
                  producer_config={"batch.size": "800"})
    kafka.set_group_config(group, "share.record.lock.duration.ms", 8000)
    log, killed = str(tmp_path / "calls.jsonl"), str(tmp_path / "killed")

    job = start_workers(connect_spark, worker_dies_once(log, killed), topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2, chunk_size=20,
                        output_topic=out, on_progress=False)
    # Done once every record is acknowledged for good and Spark's retry of the killed worker
    # reported (not on an idle timeout: the retried task's start and the dead attempt's lock
    # expiry can outlast one on a loaded machine; the survivor may drain the group first).
    summary = stop_when_drained(job, kafka, group, retried=[killed])
    connect_report(str(summary))
    outputs = check_killed_worker(kafka, summary, out, n, log, killed)
    assert summary.stop_reason == "the test is done"
    assert set(outputs.values()) == {1}, "duplicated outputs"  # the kill came before produce
    # The dead attempt's counts are from its last report (at most a second old): it may miss
    # the up to 29 records the attempt settled before it died on its 30th call.
    assert summary.totals["accepted"] >= n - 29


def test_bad_arguments_reach_the_client_before_any_task(
    kafka: LocalKafka, topic: str, group: str, connect_spark: SparkSession,
) -> None:
    common: dict[str, Any] = {"topics": topic, "group": group,
                              "bootstrap_servers": kafka.bootstrap_servers,
                              "on_progress": False}
    with pytest.raises(OptionError, match="'workers' = 64: Spark has 2 task slots"):
        run_workers(connect_spark, print, **{**common, "workers": 64})
    with pytest.raises(OptionError, match=r"'output_topic' = 'nope-.*does not exist"):
        run_workers(connect_spark, print, **{**common, "output_topic": f"nope-{uuid.uuid4()}"})
    with pytest.raises(OptionError, match=r"'control_topic'.*must differ"):
        run_workers(connect_spark, print, **{**common, "control_topic": topic})
    lock = threading.Lock()
    with pytest.raises(OptionError, match=r"'fn'.*cannot be pickled"):
        run_workers(connect_spark, lambda r: lock.locked(), **common)
    with pytest.raises(OptionError, match=r"'chunk_sise'.*did you mean 'chunk_size'"):
        run_workers(connect_spark, print, **{**common, "chunk_sise": 10})


def _four_thousand_left(kafka: LocalKafka, topic_factory: TopicFactory,
                        share_consumer: ShareConsumerFactory, group: str,
                        run: Callable[[str], None]) -> int:
    """Issue 35 over Spark Connect: 4,000 records, ``run(topic)`` (which must fail), then
    how many distinct records a fresh member of the group still gets."""
    src = topic_factory(2)
    kafka.produce(src, [f"{i}".encode() for i in range(4000)])
    run(src)
    got = poll_share(share_consumer(group, [src]), timeout_s=120, quiet_s=10,
                     until=lambda seen: len({m.value() for m in seen}) >= 4000)
    return len({m.value() for m in got})


def test_an_output_without_output_topic_fails_at_once_over_connect(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, connect_spark: SparkSession,
    share_consumer: ShareConsumerFactory,
) -> None:
    """The issue's first scenario: ``Result.accept(r.value)`` with no output_topic over
    Connect REJECTed all 4,000 records; now it stops at once and RELEASEs."""
    def run(src: str) -> None:
        with pytest.raises(ConfigurationMistakeError, match=r"'output_topic'") as caught:
            run_workers(connect_spark, lambda r: Result.accept(r.value), topics=src,
                        group=group, bootstrap_servers=kafka.bootstrap_servers, workers=2,
                        idle_timeout_s=20, on_progress=False)
        t = caught.value.summary.totals
        assert t["rejected"] == t["dead_lettered"] == t["accepted"] == 0, str(caught.value)

    assert _four_thousand_left(kafka, topic_factory, share_consumer, group, run) == 4000


def test_a_bug_on_every_record_trips_the_breaker_over_connect(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, connect_spark: SparkSession,
    share_consumer: ShareConsumerFactory,
) -> None:
    def buggy(rec: Record) -> None:
        raise KeyError("no such field")

    def run(src: str) -> None:
        with pytest.raises(CircuitBreakerError, match="failed with KeyError") as caught:
            run_workers(connect_spark, buggy, topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2,
                        retry_on=(TimeoutError,), idle_timeout_s=20, on_progress=False)
        assert caught.value.summary.totals["rejected"] <= 200, str(caught.value)

    assert _four_thousand_left(kafka, topic_factory, share_consumer, group, run) >= 3800
