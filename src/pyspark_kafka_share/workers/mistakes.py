"""Results the job's configuration cannot honour, and how a worker job ends on a failure of
the job rather than of a record.

**Configuration mistakes.** An output value without ``output_topic``, a result of a type the
workers do not know, a batch function returning the wrong number of results, a ``recoverer``
that raises: every record
would fail the same way, so none of them is poison. The worker raises :class:`JobMistake` at
the first one, RELEASEs every record it holds (none is REJECTed or dead-lettered), ends its
task normally (so Spark does not retry it) with the mistake in its final report
(:func:`failure_report`), and the driver stops the other workers and raises
:class:`~pyspark_kafka_share.errors.ConfigurationMistakeError` (:func:`job_error`).

**Circuit breaker.** The same path for a trip of a worker's breaker (``breaker.py``): its
report carries ``failure`` of kind ``breaker``.

**Spark giving up.** A worker task that failed for good (a killed Python worker on a master
that retries nothing) fails the Spark job: :func:`spark_gave_up` turns that error into one
line with the fix, followed by the summary of the attempts' last reports.

Pure logic: unit-tested in tests/unit/test_workers_mistakes.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from pyspark_kafka_share.errors import (
    CircuitBreakerError,
    ConfigurationMistakeError,
    SparkGaveUpError,
    WorkerJobError,
)

__all__ = ["JobMistake", "failure_of", "failure_report", "job_error", "no_output_topic",
           "recoverer_failed", "spark_gave_up", "unknown_fate", "unsettled", "wrong_result"]


class JobMistake(Exception):
    """Raised inside a worker for a result the configuration cannot honour."""

    def __init__(self, option: str, fix: str) -> None:
        self.option = option
        self.fix = fix
        super().__init__(f"{option}: {fix}")


def no_output_topic() -> JobMistake:
    return JobMistake("output_topic", "the function returned an output value but run_workers "
                      "has no output_topic: pass output_topic=<an existing topic>, or return "
                      "None / Result.accept() without a value")


def wrong_result(why: str) -> JobMistake:
    """A result of the wrong type, or a batch of results of the wrong length (``why``)."""
    return JobMistake("fn", f"{why} (every record would fail the same way)")


def recoverer_failed(bad: Exception, exc: Exception) -> JobMistake:
    """The job's ``recoverer`` raised ``bad`` deciding on the function's exception ``exc``: a
    bug of the job, which would decide every failing record the same way."""
    return JobMistake("recoverer", f"the recoverer raised {type(bad).__name__}: {bad} on the "
                      f"function's {type(exc).__name__}: {exc}; a recoverer returns an Outcome "
                      "or a Result for any exception (fix it, or leave recoverer unset for "
                      "retry_on's rule)"[:2000])


def failure_report(kind: str, message: str, option: str | None = None) -> dict[str, Any]:
    """The ``failure`` field of a worker's report: the job must stop (JSON-safe)."""
    return {"kind": kind, "message": message, "option": option}


def failure_of(reports: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The first failure any attempt reported (a mistake before a breaker trip)."""
    found = [r["failure"] for r in reports if isinstance(r.get("failure"), dict)]
    found.sort(key=lambda f: f.get("kind") != "mistake")
    return found[0] if found else None


def job_error(failure: Mapping[str, Any], summary: Any) -> WorkerJobError:
    """The driver's exception for a failure a worker (or the driver's breaker) reported."""
    message = str(failure.get("message"))
    if failure.get("kind") == "mistake":
        option = str(failure.get("option") or "fn")
        prefix = f"{option}: "
        return ConfigurationMistakeError(
            option, message[len(prefix):] if message.startswith(prefix) else message, summary)
    return CircuitBreakerError(message, summary)


_GAVE_UP = re.compile(r"Task \S+ in stage \S+ failed (\d+) times?")


def spark_gave_up(exc: BaseException, master: str, summary: Any) -> SparkGaveUpError | None:
    """``exc`` as a :class:`SparkGaveUpError` if Spark failed a worker task for good (its
    message says ``Task N in stage S failed K times``); None for any other error."""
    text = str(exc)
    match = _GAVE_UP.search(text)
    if match is None:
        return None
    times = int(match.group(1))
    cause = next((line.strip() for line in text.splitlines()
                  if "exited unexpectedly" in line or "ExecutorLostFailure" in line), "")
    retries = ("it retries nothing: use a master that does, e.g. local[N, 4], or "
               "spark.task.maxFailures=4 on a cluster" if times <= 1 else
               f"raise spark.task.maxFailures (or F in local[N, F]) above {times} if the "
               "cause passes")
    where = f"master {master}" if master else "this master"
    return SparkGaveUpError(
        f"Spark gave up on a worker task after {times} failed attempt(s) on {where}: "
        f"{retries}{'; ' + cause[:300] if cause else ''}. Records its attempts held come "
        "back to the group when their locks expire", summary)


def unknown_fate(attempts: Iterable[Mapping[str, Any]]) -> int:
    """Records the attempts that died (state ``lost``) had received and not settled by their
    last report: their fate is not known to the driver (settled after that report, or
    RELEASEd when their locks expired). What a lost attempt received after its last report is
    not counted at all."""
    return sum(unsettled(a) for a in attempts if a.get("state") == "lost")


def unsettled(report: Mapping[str, Any]) -> int:
    """Records an attempt had received and not settled (ACCEPTed, RELEASEd, REJECTed, or
    failed to acknowledge) by ``report`` (also the worker metrics' in-flight count)."""
    settled = sum(int(report.get(k, 0))
                  for k in ("accepted", "released", "rejected", "ack_failures"))
    return max(0, int(report.get("received", 0)) - settled)
