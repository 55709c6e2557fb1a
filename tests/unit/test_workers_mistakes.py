"""How a worker job ends on a failure of the job (workers/mistakes.py): the errors the driver
raises for a configuration mistake, a breaker trip or Spark giving up, and the records whose
fate a killed attempt leaves unknown."""

from __future__ import annotations

from typing import Any

from pyspark_kafka_share.errors import (
    CircuitBreakerError,
    ConfigurationMistakeError,
    SparkGaveUpError,
    WorkerJobError,
)
from pyspark_kafka_share.workers.mistakes import (
    failure_of,
    failure_report,
    job_error,
    no_output_topic,
    spark_gave_up,
    unknown_fate,
    wrong_result,
)

_RAW = ("An error occurred while calling o52.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage "
        "0.0 failed 1 times, most recent failure: Lost task 0.0 in stage 0.0 (TID 0) "
        "(host executor driver): org.apache.spark.SparkException: Python worker exited "
        "unexpectedly (crashed)\n\tat org.apache.spark.api.python...")


def test_a_mistake_names_the_argument_and_the_fix() -> None:
    m = no_output_topic()
    error = job_error(failure_report("mistake", str(m), m.option), summary="the summary")
    assert isinstance(error, ConfigurationMistakeError) and isinstance(error, WorkerJobError)
    assert error.option == "output_topic" and error.summary == "the summary"
    text = str(error)
    assert text.startswith("configuration mistake, 'output_topic': the function returned an "
                           "output value but run_workers has no output_topic: pass "
                           "output_topic=")
    assert text.endswith("\nthe summary")
    w = wrong_result("the batch function returned 1 results for 3 rows")
    assert w.option == "fn" and "1 results for 3 rows" in w.fix


def test_a_breaker_failure_is_a_circuit_breaker_error() -> None:
    error = job_error(failure_report("breaker", "circuit breaker tripped (job-wide): ..."),
                      None)
    assert isinstance(error, CircuitBreakerError)
    assert str(error) == "circuit breaker tripped (job-wide): ..."


def test_failure_of_prefers_a_mistake_and_skips_reports_without_one() -> None:
    breaker = failure_report("breaker", "b")
    mistake = failure_report("mistake", "m", "fn")
    reports: list[dict[str, Any]] = [{"failure": None}, {"failure": breaker}, {},
                                     {"failure": mistake}]
    assert failure_of(reports) == mistake
    assert failure_of([{"failure": None}, {}]) is None


def test_spark_giving_up_on_a_non_retrying_master_names_the_fix() -> None:
    error = spark_gave_up(RuntimeError(_RAW), "local[4]", summary="S")
    assert isinstance(error, SparkGaveUpError) and error.summary == "S"
    first = str(error).splitlines()[0]
    assert first.startswith("Spark gave up on a worker task after 1 failed attempt(s) on "
                            "master local[4]: it retries nothing: use a master that does, "
                            "e.g. local[N, 4], or spark.task.maxFailures=4")
    assert "Python worker exited unexpectedly (crashed)" in first
    assert str(error).endswith("\nS")


def test_spark_giving_up_after_retries_says_to_raise_the_limit() -> None:
    error = spark_gave_up(RuntimeError(_RAW.replace("failed 1 times", "failed 4 times")),
                          "", summary=None)
    assert error is not None and "raise spark.task.maxFailures" in str(error)
    assert "above 4" in str(error) and "this master" in str(error)


def test_other_errors_are_not_spark_giving_up() -> None:
    assert spark_gave_up(RuntimeError("Job 3 cancelled part of cancelled job group"), "x",
                         None) is None


def test_unknown_fate_counts_what_lost_attempts_held_at_their_last_report() -> None:
    attempts: list[dict[str, Any]] = [
        {"state": "lost", "received": 150, "accepted": 90, "released": 5, "rejected": 3,
         "ack_failures": 2},  # 50 unsettled
        {"state": "stopped", "received": 100, "accepted": 10},  # finished: known
        {"state": "lost"},  # died before its first report
    ]
    assert unknown_fate(attempts) == 50
