"""Retries that wait, decoding and the redrive (issue 40) against a real broker (and local
Spark for the workers): a service answering 503 for a while is waited out in the worker (no
dead letter), an undecodable record is dead-lettered with the decoder's error, and
``kafka-share dlq replay`` plans and sends dead letters back to their origin topics."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share import cli
from pyspark_kafka_share.harness import LocalKafka, ProducerRecord
from pyspark_kafka_share.workers import Backoff, Record, Result, start_workers
from tests.fixtures.kafka import TopicFactory
from tests.helpers import log_call, read_calls, read_topic, stop_when_drained

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

N = 20
FAILS = 2  # the service answers 503 to the first two calls of each record


def _headers(m: Any) -> dict[str, bytes]:
    return {k: v for k, v in (m.headers() or [])}


def test_a_503_for_a_while_is_waited_out_and_an_undecodable_record_is_dead_lettered(
    kafka: LocalKafka, topic_factory: TopicFactory, group: str, spark: SparkSession,
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    src, out, dlq = topic_factory(1), topic_factory(1), topic_factory(1)
    kafka.produce(src, [json.dumps({"id": i}).encode() for i in range(N)] + [b"{not json"])
    log = str(tmp_path / "calls.jsonl")
    calls: dict[int, int] = {}  # per worker process: in-place retries stay in it

    def call_service(rec: Record) -> Result:
        calls[rec.offset] = calls.get(rec.offset, 0) + 1
        log_call(log, rec, n=calls[rec.offset])
        if calls[rec.offset] <= FAILS:
            raise ConnectionError("503 Service Unavailable")
        return Result.accept(json.dumps({"id": rec.decoded_value["id"], "ok": True}))

    job = start_workers(spark, call_service, topics=src, group=group,
                        bootstrap_servers=kafka.bootstrap_servers, output_topic=out,
                        dead_letter_topic=dlq, retry_on=(ConnectionError,),
                        retry_backoff=Backoff(initial_s=0.2, max_s=1.0, jitter=0.2),
                        value_deserializer=json.loads, on_progress=False)
    summary = stop_when_drained(job, kafka, group)
    t = summary.totals
    # Each record: two 503s waited out in the worker, then accepted on its first delivery.
    assert (t["accepted"], t["released"], t["retries"]) == (N, 0, N * FAILS), str(summary)
    assert t["retry_wait_ms"] >= 2 * 160 and "retries in place=" in str(summary)
    calls_seen = read_calls(Path(log))
    assert {c["dc"] for c in calls_seen} == {1} and len(calls_seen) == N * (FAILS + 1)
    assert len(read_topic(kafka, out, N)) == N
    # The record its deserializer could not decode: dead-lettered with the decoder's error,
    # never passed to the function.
    assert (t["undecodable"], t["dead_lettered"], t["rejected"]) == (1, 1, 1), str(summary)
    (dead,) = read_topic(kafka, dlq, 1)
    h = _headers(dead)
    assert dead.value() == b"{not json" and h["kafka-share.origin.topic"] == src.encode()
    assert h["kafka-share.error"].startswith(b"value_deserializer: JSONDecodeError: ")
    # The redrive reads the workers' own dead letter back (plan only).
    code = cli.main(["dlq", "replay", dlq, "--bootstrap-server", kafka.bootstrap_servers,
                     "--error", "JSONDecode", "--dry-run", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and (plan["selected"], plan["sent"]) == (1, 0)
    assert plan["counts"] == [{"origin": src, "error_type": "JSONDecodeError", "count": 1}]


def _dead_letter(origin: str, offset: int, error: str, ts_ms: int) -> ProducerRecord:
    return ProducerRecord(
        value=b"v%d" % offset, key=b"k%d" % offset, timestamp_ms=ts_ms,
        headers=[("trace", b"t%d" % offset), ("kafka-share.error", error.encode()),
                 ("kafka-share.error.type", error.split(":", maxsplit=1)[0].encode()),
                 ("kafka-share.attempts", b"3"), ("kafka-share.origin.topic", origin.encode()),
                 ("kafka-share.origin.partition", b"0"),
                 ("kafka-share.origin.offset", str(offset).encode()),
                 ("kafka-share.origin.group", b"g")])


def test_dlq_replay_plans_then_sends_dead_letters_back(
    kafka: LocalKafka, topic_factory: TopicFactory, capsys: pytest.CaptureFixture[str],
) -> None:
    origin, other, dlq = topic_factory(1), topic_factory(1), topic_factory(2)
    t0 = 1_750_000_000_000
    kafka.produce(dlq, [
        _dead_letter(origin, 0, "ConnectionError: 503", t0),
        _dead_letter(origin, 1, "KeyError: 'id'", t0 + 1000),
        _dead_letter(other, 2, "ConnectionError: 503", t0 + 2000),
        _dead_letter(origin, 3, "ConnectionError: 503", t0 + 3000),
        ProducerRecord(value=b"someone else's", timestamp_ms=t0)])

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = cli.main(["dlq", "replay", dlq, "--bootstrap-server", kafka.bootstrap_servers,
                         "--timeout", "20", *args])
        got, err = capsys.readouterr()
        return code, got, err

    # Neither --dry-run nor --execute: the plan, nothing sent, the usage exit code.
    code, got, err = run("--error", "503")
    assert code == 2 and "--execute" in err and "plan only" in got
    code, got, _ = run("--error", "503", "--until", "2025-06-15T15:06:42Z", "--dry-run")
    assert code == 0 and f"{origin}  ConnectionError  1" in got
    assert "filtered out" in got and "1 without the origin headers" in got
    code, got, _ = run("--error", "^Connection", "--origin", origin, "--execute")
    assert code == 0 and "# sent 2 dead letter(s)" in got
    back = read_topic(kafka, origin, 2)
    assert sorted((m.key(), m.value()) for m in back) == [(b"k0", b"v0"), (b"k3", b"v3")]
    h = _headers(back[0])
    assert "kafka-share.error" not in h and h["trace"] in (b"t0", b"t3")
    assert h["kafka-share.replayed-from"].startswith(f"{dlq}/".encode())
    nexts = got.split("--from-offsets ")[-1].strip()
    # Run again from where the last ended: nothing new, nothing sent twice.
    code, got, _ = run("--from-offsets", nexts, "--execute", "--json")
    assert code == 0 and json.loads(got)["read"] == 0 and json.loads(got)["sent"] == 0
