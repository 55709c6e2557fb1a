"""Queue workers against a real broker and local Spark: outcomes, dead letters, stops, crashes.

Worker functions run in Spark's Python workers on this machine, so they leave evidence of each
call in files under ``tmp_path`` (one line per call), which the tests read back.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share.errors import BrokerError, OptionError
from pyspark_kafka_share.harness import LocalKafka, ProducerRecord
from pyspark_kafka_share.workers import (
    Outcome,
    Record,
    Result,
    WorkerJob,
    WorkerProgress,
    run_workers,
    start_workers,
)
from pyspark_kafka_share.workers.config import ShareClient
from tests.fixtures.kafka import ShareConsumerFactory, TopicFactory
from tests.helpers import (
    check_killed_worker,
    check_lease_keeps_second_attempt_out,
    log_call,
    poll_share,
    read_calls,
    read_topic,
    stop_when_drained,
    worker_dies_once,
)

# The worker functions below (and the helpers they call) run in Spark's Python workers, which
# cannot import this test module: ship it by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]


def _drain_share(share_consumer: ShareConsumerFactory, group: str, topic: str,
                 seconds: float) -> list[Message]:
    """What a fresh member of ``group`` receives within ``seconds`` (ACCEPTed)."""
    return poll_share(share_consumer(group, [topic]), timeout_s=seconds)


def _headers(m: Any) -> dict[str, bytes]:
    return {k: v for k, v in (m.headers() or [])}


@pytest.mark.spark_subset
@pytest.mark.kafka_subset
def test_outcomes_dead_letters_and_outputs_reach_the_broker(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
    share_consumer: ShareConsumerFactory, tmp_path: Path,
) -> None:
    src, out, dlq = topic_factory(2), topic_factory(1), topic_factory(1)
    records = [ProducerRecord(value=f"{kind}-{i}".encode(), key=f"k{i}".encode(),
                              headers=[("trace", f"t{i}".encode())])
               for i in range(10) for kind in ("ok", "retry", "poison")]
    kafka.produce(src, records)
    log = str(tmp_path / "calls.jsonl")

    def handle(rec: Record) -> Result | Outcome:
        log_call(log, rec)
        kind = (rec.value or b"").decode().split("-")[0]
        if kind == "poison":
            return Result.reject("unparseable order")
        if kind == "retry" and rec.delivery_count == 1:
            raise TimeoutError("enrichment service timed out")
        return Result.accept(f"{(rec.value or b'').decode()}:dc={rec.delivery_count}")

    job = start_workers(spark, handle, topics=[src], group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2,
                        output_topic=out, dead_letter_topic=dlq, on_progress=False)
    # Done once every record is settled for good and the counters reached the broker's count
    # (the last report is at most a report interval behind the lag).
    summary = stop_when_drained(job, kafka, group, settled=lambda: _settled(job, 30))

    t = summary.totals
    assert (t["accepted"], t["released"], t["rejected"], t["dead_lettered"], t["outputs"]) \
        == (20, 10, 10, 10, 20), str(summary)
    assert summary.stop_reason == "the test is done"
    outputs = Counter((m.value() or b"").decode() for m in read_topic(kafka, out, 20))
    assert outputs == Counter([f"ok-{i}:dc=1" for i in range(10)]
                              + [f"retry-{i}:dc=2" for i in range(10)])
    dead = read_topic(kafka, dlq, 10)
    assert sorted((m.value() or b"").decode() for m in dead) == \
        sorted(f"poison-{i}" for i in range(10))
    for m in dead:
        h = _headers(m)
        i = (m.value() or b"").decode().split("-")[1]
        assert m.key() == f"k{i}".encode()
        assert h["trace"] == f"t{i}".encode()  # the original headers travel along
        assert h["kafka-share.error"] == b"unparseable order"
        assert h["kafka-share.attempts"] == b"1"
        assert h["kafka-share.origin.topic"] == src.encode()
        assert h["kafka-share.origin.group"] == group.encode()
        assert int(h["kafka-share.origin.offset"]) >= 0
    calls = Counter(c["value"] for c in read_calls(Path(log)))
    assert all(calls[f"ok-{i}"] == 1 and calls[f"poison-{i}"] == 1 and calls[f"retry-{i}"] == 2
               for i in range(10)), calls
    # ACCEPTed and REJECTed records are never delivered again.
    assert _drain_share(share_consumer, group, src, 4.0) == []


def _settled(job: WorkerJob, n: int) -> bool:
    """The job's counters show all of ``n`` records settled for good (accepted or rejected)."""
    t = job.progress().totals
    return t["accepted"] + t["rejected"] >= n


def test_an_idle_group_stops_on_the_idle_timeout(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
) -> None:
    """The idle timeout itself, on a group with nothing to do (no record can come late, so the
    verdict does not hang on the machine's speed): the job stops with "idle timeout", not
    before every worker was idle that long. The time budget only ends a job whose idle timeout
    never fires (the test then fails on its stop reason)."""
    src = topic_factory(2)
    started = time.monotonic()
    summary = run_workers(spark, lambda r: None, topics=src, group=group,
                          bootstrap_servers=kafka.bootstrap_servers, workers=2,
                          idle_timeout_s=4, time_budget_s=300, on_progress=False)
    assert summary.stop_reason == "idle timeout", str(summary)
    assert time.monotonic() - started >= 4, str(summary)
    assert summary.totals["processed"] == 0, str(summary)


@pytest.mark.kafka_subset
@pytest.mark.parametrize("client", ["librdkafka", "native"])
def test_max_attempts_then_dead_letter_and_non_retryable_errors(
    kafka: LocalKafka, topic: str, topic_factory: TopicFactory, group: str, spark: SparkSession,
    tmp_path: Path, client: ShareClient,
) -> None:
    dlq = topic_factory(1)
    kafka.produce(topic, [b"flaky", b"broken", b"fine"])
    log = str(tmp_path / "calls.jsonl")

    def handle(rec: Record) -> None:
        log_call(log, rec)
        if rec.value == b"flaky":
            raise TimeoutError("still down")
        if rec.value == b"broken":
            raise KeyError("no such field")  # not in retry_on: poison at once

    job = start_workers(spark, handle, topics=topic, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, dead_letter_topic=dlq,
                        max_attempts=3, retry_on=(TimeoutError,), on_progress=False,
                        client=client)
    summary = stop_when_drained(job, kafka, group)
    calls = [(c["value"], c["dc"]) for c in read_calls(Path(log))]
    assert sorted(calls) == sorted([("flaky", 1), ("flaky", 2), ("flaky", 3), ("broken", 1),
                                    ("fine", 1)])
    dead = {(m.value() or b"").decode(): _headers(m) for m in read_topic(kafka, dlq, 2)}
    assert set(dead) == {"flaky", "broken"}
    assert dead["flaky"]["kafka-share.attempts"] == b"3"
    assert dead["flaky"]["kafka-share.error"].startswith(b"gave up after 3 attempts: Timeout")
    assert dead["broken"]["kafka-share.attempts"] == b"1"
    assert dead["broken"]["kafka-share.error.type"] == b"KeyError"
    t = summary.totals
    assert (t["accepted"], t["released"], t["rejected"], t["exhausted"]) == (1, 2, 2, 1)


@pytest.mark.spark_subset
def test_batch_form_with_pandas_and_arrow(
    kafka: LocalKafka, topic: str, topic_factory: TopicFactory, group: str, spark: SparkSession,
) -> None:
    out = topic_factory(1)
    kafka.produce(topic, [str(i).encode() for i in range(50)])

    def square(df: Any) -> list[Any]:
        # A pandas frame with the kafka-share source's columns.
        assert {"key", "value", "offset", "deliveryCount", "headers"} <= set(df.columns)
        return [str(int(v) ** 2) if int(v) % 10 else Outcome.REJECT for v in df["value"]]

    job = start_workers(spark, square, topics=topic, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, batch_format="pandas",
                        output_topic=out, on_progress=False)
    summary = stop_when_drained(job, kafka, group)
    assert (summary.totals["accepted"], summary.totals["rejected"]) == (45, 5)
    got = sorted(int(m.value() or b"") for m in read_topic(kafka, out, 45))
    assert got == sorted(i * i for i in range(50) if i % 10)

    # Arrow: a None result accepts the whole batch.
    kafka.produce(topic, [b"x"] * 7)
    job = start_workers(spark, lambda table: None, topics=topic, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, batch_format="arrow",
                        on_progress=False)
    summary = stop_when_drained(job, kafka, group)
    assert summary.totals["accepted"] == 7


def test_more_workers_than_partitions_all_get_work(
    kafka: LocalKafka, topic: str, group: str, spark: SparkSession, tmp_path: Path,
) -> None:
    slots = spark.sparkContext.defaultParallelism
    kafka.produce(topic, [f"{i}".encode() for i in range(600)],
                  producer_config={"batch.size": "400"})  # small batches: work to share
    log = str(tmp_path / "calls.jsonl")

    def slow(rec: Record) -> None:
        log_call(log, rec)
        time.sleep(0.02)

    # Stopped once every record is acknowledged: an idle timeout (6 s) ended this job with
    # records left on a loaded machine (accepted 569 of 600).
    job = start_workers(spark, slow, topics=topic, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=slots,
                        chunk_size=10, on_progress=False)
    summary = stop_when_drained(job, kafka, group)
    assert summary.totals["accepted"] == 600
    per_worker = {w["worker"]: w.get("processed", 0) for w in summary.workers}
    assert len(per_worker) == slots > 1
    assert all(n > 0 for n in per_worker.values()), per_worker
    assert Counter(c["worker"] for c in read_calls(Path(log))) == Counter(
        {w: n for w, n in per_worker.items()})


@pytest.mark.kafka_subset
@pytest.mark.parametrize("client", [  # the native client does not depend on Spark's line
    pytest.param("librdkafka", marks=pytest.mark.spark_subset), "native"])
def test_killed_worker_loses_nothing(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
    tmp_path: Path, client: ShareClient,
) -> None:
    src, out = topic_factory(2), topic_factory(1)
    n = 400
    kafka.produce(src, [f"{i}".encode() for i in range(n)],
                  producer_config={"batch.size": "800"})
    kafka.set_group_config(group, "share.record.lock.duration.ms", 8000)
    log, killed = str(tmp_path / "calls.jsonl"), str(tmp_path / "killed")

    job = start_workers(spark, worker_dies_once(log, killed), topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2, chunk_size=20,
                        output_topic=out, on_progress=False, client=client)
    # The killed worker's records came back, and Spark's retry of it reported (the survivor
    # may drain the group before it starts).
    summary = stop_when_drained(job, kafka, group, retried=[killed])
    check_killed_worker(kafka, summary, out, n, log, killed)
    assert "died" in str(summary)  # the killed attempt is in the summary, its work counted
    assert summary.totals["accepted"] >= n - 60


@pytest.mark.parametrize("how", ["stop", "ctrl_c", "time_budget", "max_records"])
def test_stopping_releases_records_in_flight(
    how: str, kafka: LocalKafka, topic: str, group: str, spark: SparkSession,
    share_consumer: ShareConsumerFactory,
) -> None:
    n = 200
    # One producer batch: the broker hands the whole batch to one poll.
    kafka.produce(topic, [f"{i}".encode() for i in range(n)],
                  producer_config={"linger.ms": "50"})

    def slow(rec: Record) -> None:
        time.sleep(0.1)

    # The budget counts from the start, so it includes starting the task and joining the group.
    kwargs: dict[str, Any] = {"time_budget_s": 10} if how == "time_budget" else \
        {"max_records": 20} if how == "max_records" else {}
    if how == "ctrl_c":
        interrupted: list[bool] = []

        def press_ctrl_c(p: WorkerProgress) -> None:
            if p.totals["processed"] >= 20 and not interrupted:
                interrupted.append(True)
                os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C in a notebook or shell does

        before = signal.getsignal(signal.SIGINT)
        summary = run_workers(spark, slow, topics=topic, group=group,
                              bootstrap_servers=kafka.bootstrap_servers, chunk_size=5,
                              on_progress=press_ctrl_c, progress_interval_s=0.5)
        assert summary.stop_reason == "interrupted"
        assert signal.getsignal(signal.SIGINT) is before  # PySpark's handler is back
        job = None
    else:
        job = start_workers(spark, slow, topics=topic, group=group,
                            bootstrap_servers=kafka.bootstrap_servers, chunk_size=5,
                            on_progress=False, **kwargs)
    if job is None:
        pass
    elif how == "stop":
        deadline = time.monotonic() + 60
        while job.progress().totals["processed"] < 20 and time.monotonic() < deadline:
            time.sleep(0.2)
        stopped = job.stop()
        assert stopped is not None
        assert stopped.stop_reason == "stopped by user"
        summary = stopped
    else:
        summary = job.wait(120)
        assert summary.stop_reason == {"time_budget": "time budget",
                                       "max_records": "record count"}[how]
    t = summary.totals
    assert 0 < t["accepted"] < n
    assert t["released_on_stop"] > 0
    # The released records are available at once (the lock is 30 s), with one more delivery.
    rest = _drain_share(share_consumer, group, topic, 8.0)
    assert len(rest) == n - t["accepted"], (len(rest), str(summary))
    assert {m.delivery_count() for m in rest} <= {1, 2}
    assert sum(1 for m in rest if m.delivery_count() == 2) >= t["released_on_stop"] - 5


def test_bad_arguments_fail_before_any_task(
    kafka: LocalKafka, topic: str, group: str, spark: SparkSession,
) -> None:
    common: dict[str, Any] = {"topics": topic, "group": group,
                              "bootstrap_servers": kafka.bootstrap_servers,
                              "on_progress": False}
    with pytest.raises(OptionError, match="'workers' = 64: Spark has"):
        run_workers(spark, print, **{**common, "workers": 64})
    with pytest.raises(OptionError, match="'max_attempts' = 9: the broker archives"):
        run_workers(spark, print, **{**common, "max_attempts": 9})
    with pytest.raises(OptionError, match=r"'output_topic' = 'nope-.*does not exist"):
        run_workers(spark, print, **{**common, "output_topic": f"nope-{uuid.uuid4().hex}"})
    with pytest.raises(OptionError, match=r"'output_topic'.*must differ"):
        run_workers(spark, print, **{**common, "output_topic": topic})
    with pytest.raises(OptionError, match="'batch_format' = 'csv'"):
        run_workers(spark, print, **{**common, "batch_format": "csv"})
    with pytest.raises(OptionError, match="'topics' = ''"):
        run_workers(spark, print, **{**common, "topics": []})
    with pytest.raises(BrokerError, match=r"'topics' = 'missing-.*do not exist"):
        run_workers(spark, print, **{**common, "topics": f"missing-{uuid.uuid4().hex[:6]}"})
    with pytest.raises(OptionError, match=r"consumer_config\['enable.auto.commit'\]"):
        run_workers(spark, print, **{**common,
                                     "consumer_config": {"enable.auto.commit": "true"}})
    with pytest.raises(OptionError, match=r"'retry_on'.*Exception subclasses"):
        run_workers(spark, print, **{**common, "retry_on": (BaseException,)})
    lock = threading.Lock()
    with pytest.raises(OptionError, match=r"'fn'.*cannot be pickled"):
        run_workers(spark, lambda r: lock.locked(), **common)
    with pytest.raises(OptionError, match=r"producer_config\['acks'\].*always 'all'"):
        run_workers(spark, print, **{**common, "producer_config": {"acks": "1"}})
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


def test_output_the_broker_refuses_is_never_accepted(
    kafka: LocalKafka, topic: str, topic_factory: TopicFactory, group: str, spark: SparkSession,
) -> None:
    dlq = topic_factory(1)
    small = f"small-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(small, 1, config={"max.message.bytes": "1024"})
    kafka.produce(topic, [b"tiny", b"huge"])

    def enlarge(rec: Record) -> bytes:
        return (rec.value or b"") * (1 if rec.value == b"tiny" else 2000)

    job = start_workers(spark, enlarge, topics=topic, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, output_topic=small,
                        # one record per chunk: the broker refuses whole producer batches
                        dead_letter_topic=dlq, max_attempts=2, chunk_size=1, on_progress=False)
    summary = stop_when_drained(job, kafka, group)
    t = summary.totals
    # "huge": output refused -> RELEASE (attempt 1) -> refused again -> dead letter, REJECT.
    assert (t["accepted"], t["released"], t["rejected"], t["produce_failures"]) == (1, 1, 1, 2)
    assert [m.value() for m in read_topic(kafka, small, 1)] == [b"tiny"]
    dead = read_topic(kafka, dlq, 1)
    assert [m.value() for m in dead] == [b"huge"]
    error = _headers(dead[0])["kafka-share.error"].decode()
    assert error.startswith("gave up after 2 attempts: output not delivered"), error


def test_a_second_attempt_of_a_running_worker_opens_no_consumer(
    kafka: LocalKafka, topic: str, group: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A speculative (or late) copy of a worker task waits for its worker index's lease from
    the driver instead of joining the group as a second consumer, and ends without a consumer
    when the holder finishes. Two attempts of worker 0 run in threads against a real broker
    and the driver's control server, as Spark's speculation would run them."""
    from pyspark_kafka_share.workers.control import ControlServer

    check_lease_keeps_second_attempt_out(kafka, topic, group, monkeypatch,
                                         ControlServer("127.0.0.1"))
