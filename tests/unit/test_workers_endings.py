"""How the driver ends a worker job that failed as a job (issue 35), with a scripted Spark
session and the control channel's state (no broker, no Spark): a worker's reported mistake,
the job-wide circuit breaker fed by reports, and Spark giving up on a task."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from pyspark_kafka_share.errors import (
    CircuitBreakerError,
    ConfigurationMistakeError,
    SparkGaveUpError,
)
from pyspark_kafka_share.workers.api import WorkerJob
from pyspark_kafka_share.workers.config import WorkerConfig, WorkerSpec
from pyspark_kafka_share.workers.control import ControlState, Endpoint


class _Server(ControlState):
    endpoint = Endpoint("127.0.0.1", 1, "s")

    def close(self) -> None:
        pass


class _Frame:
    def __init__(self, collect: Any) -> None:
        self._collect = collect

    def mapInArrow(self, task: Any, schema: str) -> _Frame:
        return self

    def collect(self) -> list[dict[str, str]]:
        return [{"summary": json.dumps(r)} for r in self._collect()]


class _Context:
    master = "local[2]"

    def setJobGroup(self, *args: Any, **kw: Any) -> None:
        pass

    def cancelJobGroup(self, group: str) -> None:
        pass


class _Spark:
    """A classic session whose one job returns (or raises) what ``collect`` does."""

    def __init__(self, collect: Any) -> None:
        self.sparkContext = _Context()
        self._collect = collect

    def range(self, *args: Any) -> _Frame:
        return _Frame(self._collect)


def _job(collect: Any, server: _Server) -> WorkerJob:
    config = WorkerConfig.create(topics="in", group="g", bootstrap_servers="b:9092",
                                 workers=2)
    spec = WorkerSpec(config, lock_ms=30_000, delivery_limit=5)
    return WorkerJob(_Spark(collect), spec, lambda r: None, server=server, on_progress=None)


def _stopped(worker: int, **counts: Any) -> dict[str, Any]:
    return {"worker": worker, "attempt": 0, "state": "stopped", **counts}


def test_a_reported_mistake_is_raised_with_the_summary() -> None:
    mistake = {"kind": "mistake", "option": "output_topic",
               "message": "output_topic: the function returned an output value ..."}
    results = [_stopped(0, received=100, released=100, failure=mistake),
               _stopped(1, stop_reason="stopped by driver")]
    with pytest.raises(ConfigurationMistakeError, match="'output_topic': the function") as e:
        _job(lambda: results, _Server()).wait(10)
    assert e.value.option == "output_topic"
    assert e.value.summary.totals["released"] == 100


def test_the_job_wide_breaker_stops_every_worker_from_their_reports() -> None:
    server = _Server()
    stopped = threading.Event()

    def collect() -> list[dict[str, Any]]:
        # Two workers, each 15 records with 12 KeyErrors: too few for a worker's own
        # breaker (20), enough job-wide (24 of 30).
        for w in (0, 1):
            server.update({"worker": w, "attempt": 0, "state": "running", "processed": 15,
                           "rejected": 12, "failures": {"KeyError": 12}})
        deadline = time.monotonic() + 10
        while server.stop_reason is None and time.monotonic() < deadline:
            time.sleep(0.05)
        stopped.set()
        return [_stopped(w, processed=15, rejected=12, failures={"KeyError": 12})
                for w in (0, 1)]

    with pytest.raises(CircuitBreakerError, match=r"job-wide.*24 of the last 30 records failed "
                                                   r"with KeyError"):
        _job(collect, server).wait(15)
    assert stopped.is_set() and server.stop_reason == "circuit breaker"


def test_spark_giving_up_names_the_fix_and_counts_the_lost_attempt() -> None:
    server = _Server()

    def collect() -> list[dict[str, Any]]:
        server.update({"worker": 0, "attempt": 0, "state": "running", "received": 120,
                       "processed": 100, "accepted": 90, "released": 10})
        raise RuntimeError("Job aborted due to stage failure: Task 0 in stage 0.0 failed 1 "
                           "times, most recent failure: ... Python worker exited "
                           "unexpectedly (crashed)")

    with pytest.raises(SparkGaveUpError) as e:
        _job(collect, server).wait(10)
    text = str(e.value)
    assert text.startswith("Spark gave up on a worker task after 1 failed attempt(s) on master "
                           "local[2]: it retries nothing")
    assert "1 attempt(s) died" in text and "the fate of 20 record(s)" in text
    assert isinstance(e.value.__cause__, RuntimeError)
