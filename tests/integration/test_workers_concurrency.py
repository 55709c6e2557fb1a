"""Many calls in flight per queue worker (``concurrency``, issue 40) against a real broker and
local Spark: each record once with an ``async def`` and with a plain function, a worker killed
with many calls in flight (nothing lost; with ``exactly_once_outputs`` each output once), a call
hanging past the lock (RELEASEd, its late result discarded).

The functions leave evidence of each call (its start and end) in files under ``tmp_path``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share.harness import LocalKafka
from pyspark_kafka_share.workers import Backoff, Record, start_workers
from tests.fixtures.kafka import TopicFactory
from tests.helpers import (
    assert_exactly_once,
    check_killed_worker,
    log_call,
    output_origins,
    read_calls,
    read_topic,
    record_key,
    stop_when_drained,
    worker_dies_once,
)

# The functions below run in Spark's Python workers, which cannot import this module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

N = 200


def _most_at_once(calls: list[dict[str, Any]]) -> int:
    """The most calls one worker had running at the same time (from their start and end)."""
    most = 0
    for w in {c["worker"] for c in calls}:
        edges = sorted([(c["t0"], 1) for c in calls if c["worker"] == w] +
                       [(c["t1"], -1) for c in calls if c["worker"] == w])
        now = 0
        for _, step in edges:
            now += step
            most = max(most, now)
    return most


def _sleeper(log: str, asynchronous: bool) -> Any:
    """Waits 50 ms per record (awaits, or sleeps on its thread), outputs the value."""

    async def awaits(rec: Record) -> bytes:
        t0 = time.time()
        await asyncio.sleep(0.05)
        log_call(log, rec, t0=t0, t1=time.time())
        return rec.value or b""

    def sleeps(rec: Record) -> bytes:
        t0 = time.time()
        time.sleep(0.05)
        log_call(log, rec, t0=t0, t1=time.time())
        return rec.value or b""

    return awaits if asynchronous else sleeps


@pytest.mark.parametrize("kind", ["async", "thread"])
def test_many_calls_in_flight_settle_each_record_once(
    kind: str, kafka: LocalKafka, topic_factory: TopicFactory, group: str,
    spark: SparkSession, tmp_path: Path,
) -> None:
    src, out = topic_factory(2), topic_factory(1)
    kafka.produce(src, [b"%d" % i for i in range(N)])
    log = str(tmp_path / "calls.jsonl")
    job = start_workers(spark, _sleeper(log, kind == "async"), topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2, concurrency=16,
                        output_topic=out, on_progress=False)
    summary = stop_when_drained(job, kafka, group)
    t = summary.totals
    assert (t["processed"], t["accepted"], t["outputs"]) == (N, N, N), str(summary)
    assert t["released_in_flight"] == t["late_discarded"] == 0
    outputs = Counter((m.value() or b"").decode() for m in read_topic(kafka, out, N))
    assert outputs == Counter({str(i): 1 for i in range(N)})
    calls = read_calls(Path(log))
    assert len(calls) == N
    assert _most_at_once(calls) > 1, "the calls ran one at a time"
    assert "concurrency: slots filled" in str(summary) and 0 < summary.slots_filled <= 1


@pytest.mark.parametrize("exactly_once", [False, True], ids=["at_least_once", "exactly_once"])
def test_a_worker_killed_with_many_calls_in_flight_loses_nothing(
    exactly_once: bool, kafka: LocalKafka, topic_factory: TopicFactory, group: str,
    spark: SparkSession, tmp_path: Path,
) -> None:
    """A Python worker dies (``os._exit``) at its 30th call with up to 64 calls in flight on its
    threads: nothing lost (the records come back when their locks expire); with
    ``exactly_once_outputs`` a ``read_committed`` reader sees each origin once."""
    src, out = topic_factory(2), topic_factory(1)
    n = 400
    kafka.produce(src, [b"%d" % i for i in range(n)])
    kafka.set_group_config(group, "share.record.lock.duration.ms", 8000)
    log, killed = str(tmp_path / "calls.jsonl"), str(tmp_path / "killed")
    job = start_workers(spark, worker_dies_once(log, killed), topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2, concurrency=64,
                        output_topic=out, exactly_once_outputs=exactly_once,
                        on_progress=False)
    summary = stop_when_drained(job, kafka, group, retried=[killed])
    outputs = check_killed_worker(kafka, summary, out, n, log, killed)
    if exactly_once:
        assert outputs == Counter({str(i): 1 for i in range(n)})
        origins = output_origins(read_topic(kafka, out, n))
        inputs = {record_key(m) for m in read_topic(kafka, src, n)}
        assert_exactly_once(origins, inputs)


def _hangs_once(log: str) -> Any:
    """Hangs 10 s on the first delivery of record ``0`` (past the 2 s lock deadline), then
    returns ``late``; every other call returns its value at once."""

    def work(rec: Record) -> bytes:
        log_call(log, rec)
        if rec.value == b"0" and rec.delivery_count == 1:
            time.sleep(10)
            return b"late"
        return rec.value or b""

    return work


def test_a_call_hanging_past_the_lock_is_released_and_its_late_result_discarded(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
    tmp_path: Path,
) -> None:
    src, out = topic_factory(1), topic_factory(1)
    n = 20
    kafka.produce(src, [b"%d" % i for i in range(n)])
    # The poll's deadline: half of a 4 s lock (lock_safety_fraction 0.5).
    kafka.set_group_config(group, "share.record.lock.duration.ms", 4000)
    log = str(tmp_path / "calls.jsonl")
    job = start_workers(spark, _hangs_once(log), topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=1, concurrency=4,
                        output_topic=out, on_progress=False)
    summary = stop_when_drained(
        job, kafka, group, settled=lambda: job.progress().totals["late_discarded"] >= 1)
    t = summary.totals
    assert t["released_in_flight"] >= 1 and t["late_discarded"] >= 1, str(summary)
    outputs = Counter((m.value() or b"").decode() for m in read_topic(kafka, out, n))
    assert outputs == Counter({str(i): 1 for i in range(n)})  # no "late", "0" once
    zero = [c["dc"] for c in read_calls(Path(log)) if c["value"] == "0"]
    assert zero[:2] == [1, 2], zero  # released while it hung, then run again


def _paced(log: str) -> Any:
    """Awaits 20 ms per call; a record whose value is a multiple of 4 answers "429" (a
    ``TimeoutError``, retried) on its first call in its worker. Each call's start logged."""
    calls: Counter[tuple[int, int]] = Counter()  # per worker process: retries stay in it

    async def work(rec: Record) -> bytes:
        key = (rec.partition, rec.offset)
        calls[key] += 1
        log_call(log, rec, t0=time.time(), n=calls[key])
        await asyncio.sleep(0.02)
        if int(rec.value or b"0") % 4 == 0 and calls[key] == 1:
            raise TimeoutError("429 Too Many Requests")
        return rec.value or b""

    return work


RATE = 40.0  # records/s for the job: 20 per worker, each worker's bucket holding 20


def test_calls_in_flight_are_retried_with_backoff_within_the_rate_limit(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
    tmp_path: Path,
) -> None:
    """``concurrency=8`` with ``retry_backoff`` and ``rate_limit``: the records that failed
    are retried in their worker after their wait (none RELEASEd, none dead-lettered), every
    call's start (retries too) takes a token of its worker's bucket, and each record lands
    once."""
    src, out = topic_factory(2), topic_factory(1)
    n = 120
    kafka.produce(src, [b"%d" % i for i in range(n)])
    log = str(tmp_path / "calls.jsonl")
    job = start_workers(spark, _paced(log), topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2, concurrency=8,
                        output_topic=out, retry_on=(TimeoutError,),
                        retry_backoff=Backoff(initial_s=0.1, max_s=0.2, jitter=0.2),
                        rate_limit=RATE, on_progress=False)
    summary = stop_when_drained(job, kafka, group)
    t = summary.totals
    failing = n // 4
    assert (t["accepted"], t["retries"], t["released"], t["dead_lettered"]) == \
        (n, failing, 0, 0), str(summary)
    assert t["retry_wait_ms"] >= failing * 80 and t["rate_limit_wait_ms"] > 0
    outputs = Counter((m.value() or b"").decode() for m in read_topic(kafka, out, n))
    assert outputs == Counter({str(i): 1 for i in range(n)})
    calls = read_calls(Path(log))
    assert len(calls) == n + failing and all(c["dc"] == 1 for c in calls)
    # The token bucket's bound, per worker: by any call's start, at most the burst (a
    # second's worth) plus the rate times the time since the worker's first call.
    per_worker = RATE / 2
    for w in {c["worker"] for c in calls}:
        starts = sorted(c["t0"] for c in calls if c["worker"] == w)
        for k, at in enumerate(starts, start=1):
            assert k <= per_worker + per_worker * (at - starts[0]) + 1, (w, k, at - starts[0])


def test_the_docs_http_example_enriches_every_order(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
) -> None:
    """docs/workers.md's async HTTP example: its service and its function, as written, on
    this session's broker and Spark (its ``__main__`` part starts a broker and Spark of its
    own)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "workers.md").read_text()
    section = text.split("### Worked example: enrich records with an HTTP service")[1]
    example: dict[str, Any] = {"__name__": "workers_docs_example"}  # shipped by value
    exec(compile(section.split("```python\n")[1].split("```")[0], "docs/workers.md", "exec"),
         example)
    example["start_service"]()
    src, out, dlq = topic_factory(2), topic_factory(1), topic_factory(1)
    n = 300
    kafka.produce(src, [json.dumps({"id": i}).encode() for i in range(n)])
    job = start_workers(spark, example["enrich"], topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2, concurrency=64,
                        output_topic=out, dead_letter_topic=dlq,
                        retry_on=(example["ServiceBusy"], OSError), on_progress=False)
    summary = stop_when_drained(job, kafka, group)
    enriched = [json.loads(m.value() or b"") for m in read_topic(kafka, out, n)]
    assert sorted(o["id"] for o in enriched) == list(range(n)), str(summary)
    assert all(0 <= o["risk"] <= 9 for o in enriched)
    assert summary.totals["dead_lettered"] == 0
