"""The queue workers' circuit breaker (workers/breaker.py): the rule, its window, its two
feeders (a worker's chunks before settling, the driver's sums of reports) and its options."""

from __future__ import annotations

from typing import Any

import pytest

from pyspark_kafka_share.errors import OptionError
from pyspark_kafka_share.workers.breaker import (
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW,
    Breaker,
    ChunkJudge,
    JobBreaker,
    check_breaker,
    min_records,
)
from pyspark_kafka_share.workers.config import WorkerConfig


def test_defaults_are_documented_values() -> None:
    assert (DEFAULT_THRESHOLD, DEFAULT_WINDOW, min_records(DEFAULT_WINDOW)) == (0.5, 100, 20)
    config = WorkerConfig.create(topics="in", group="g", bootstrap_servers="b:9092")
    assert (config.circuit_breaker, config.circuit_breaker_window) == (0.5, 100)


def test_poison_at_the_threshold_trips_once_enough_records_were_seen() -> None:
    b = Breaker(0.5, 100)
    assert b.add(19, 19, {}) is None  # below min_records: not judged
    trip = b.add(1, 1, {})
    assert trip is not None and (trip.cause, trip.count, trip.seen) == ("poison", 20, 20)
    assert "20 of the last 20 records were rejected or dead-lettered" in trip.message("job")


def test_at_or_below_the_threshold_does_not_trip() -> None:
    assert Breaker(0.5, 100).add(100, 49, {"KeyError": 49}) is None
    # Exactly half (every other record poison, as some tests' queues are) runs on.
    assert Breaker(0.5, 100).add(20, 10, {}) is None
    assert Breaker(0.5, 100).add(21, 11, {}) is not None
    assert Breaker(0, 100).add(20, 1, {}) is not None  # 0: any failure trips


def test_the_same_exception_type_trips_and_is_named() -> None:
    # Retried failures (RELEASE) are not poison yet, but the same type on most records is.
    trip = Breaker(0.5, 100).add(40, 0, {"TimeoutError": 30, "KeyError": 5})
    assert trip is not None and (trip.cause, trip.count) == ("TimeoutError", 30)
    assert "failed with TimeoutError" in trip.message("worker 0")
    # Different types, none at the threshold, and little poison: no trip.
    assert Breaker(0.5, 100).add(40, 10, {"A": 15, "B": 15}) is None


def test_the_window_forgets_old_records() -> None:
    b = Breaker(0.5, 100)
    assert b.add(40, 15, {}) is None  # 15/40
    for _ in range(10):
        assert b.add(20, 0, {}) is None  # healthy records push the old ones out
    trip = b.add(80, 60, {})  # 60 of the last 100 (the newest 20-bucket and this one)
    assert trip is not None and trip.seen == 100 and trip.count == 60


def test_off_never_trips() -> None:
    b = Breaker(None, 100)
    assert b.add(1000, 1000, {"KeyError": 1000}) is None


def test_a_worker_judge_stays_tripped_and_counts_failures() -> None:
    j = ChunkJudge(0.5, 10)
    assert j.judge([(True, "KeyError")]) is None  # 1 < min_records(10) = 2
    trip = j.judge([(True, "KeyError")])
    assert trip is not None and trip.cause == "KeyError"
    assert j.judge([(False, None)] * 50) is trip  # still tripped
    assert j.failures == {"KeyError": 2}


def test_the_job_breaker_judges_the_increments_of_the_reports() -> None:
    job = JobBreaker(0.5, 100)
    r0: dict[str, Any] = {"processed": 100, "rejected": 10, "failures": {"KeyError": 10}}
    r1: dict[str, Any] = {"processed": 50, "rejected": 0, "failures": {}}
    assert job.observe([r0, r1]) is None
    r0 = {"processed": 200, "rejected": 90, "failures": {"KeyError": 90}}  # +100, +80
    trip = job.observe([r0, r1])
    assert trip is not None and trip.cause == "KeyError" and trip.count >= 80
    assert job.observe([r0, r1]) is trip


def test_the_job_breaker_ignores_malformed_report_fields() -> None:
    job = JobBreaker(0.5, 10)
    assert job.observe([{"processed": "x", "rejected": True, "failures": [1]}]) is None


@pytest.mark.parametrize(("threshold", "window"), [(1, 100), (-0.1, 100), (True, 100),
                                                   ("half", 100), (0.5, 0), (0.5, 2.5)])
def test_bad_options_name_the_argument(threshold: object, window: object) -> None:
    name = "circuit_breaker" if window in (100,) else "circuit_breaker_window"
    with pytest.raises(OptionError, match=name):
        check_breaker(threshold, window)
    with pytest.raises(OptionError, match=name):
        WorkerConfig.create(topics="in", group="g", bootstrap_servers="b:9092",
                            circuit_breaker=threshold, circuit_breaker_window=window)


def test_none_zero_and_almost_one_are_valid_thresholds() -> None:
    check_breaker(None, 1)
    check_breaker(0, 100)
    check_breaker(0.99, 100)
