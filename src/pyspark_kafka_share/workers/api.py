"""Queue workers: user code decides each record's outcome, on Spark executors.

In a share group only the consumer that acquired a record may acknowledge it, so the function
that decides a record's fate must run where the consumer runs. :func:`run_workers` starts
``workers`` Spark tasks, each a long-lived share consumer that hands records to ``fn`` and
acknowledges each one as ``fn`` decides::

    from pyspark_kafka_share.workers import Result, run_workers

    def score(record):                        # or a whole batch: batch_format="pandas"
        label = model.predict(record.value)    # an exception -> RELEASE (retried)
        return Result.accept(label)            # produced to output_topic, then ACCEPTed

    summary = run_workers(spark, score, topics=["requests"], group="scorers",
                          bootstrap_servers="broker:9092", workers=8,
                          output_topic="scores", dead_letter_topic="requests-dlq",
                          max_attempts=3, idle_timeout_s=60)

``spark`` is a classic SparkSession or a Spark Connect one (``SparkSession.builder.remote``),
with the same arguments and results. A classic driver runs the job in a job group and talks to
the workers over a TCP port (``control.py``); a Connect client has neither a SparkContext nor
a port the executors can reach, so it tags the job (``addTag``/``interruptTag``) and talks to
the workers through a control topic on the Kafka cluster (``control_kafka.py``). Guarantees
and limits: ``docs/workers.md``.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pyspark_kafka_share._spark import require_pandas
from pyspark_kafka_share.errors import OptionError
from pyspark_kafka_share.workers.breaker import JobBreaker
from pyspark_kafka_share.workers.config import WorkerConfig, WorkerOptions, WorkerSpec
from pyspark_kafka_share.workers.control import ControlServer, DriverChannel
from pyspark_kafka_share.workers.control_kafka import KafkaControlServer, control_topic_name
from pyspark_kafka_share.workers.loop import (
    DLQ_HEADERS,
    DUPLICATE,
    ArrowTask,
    results_of,
    worker_task,
)
from pyspark_kafka_share.workers.mistakes import (
    failure_of,
    failure_report,
    job_error,
    spark_gave_up,
    unknown_fate,
)
from pyspark_kafka_share.workers.outcome import Outcome, Record, Result, WorkerFunction
from pyspark_kafka_share.workers.phases import MAXIMA, PHASES, phase_line
from pyspark_kafka_share.workers.preflight import (
    check_callables,
    check_environment,
    check_function,
    check_python,
    check_session,
    explained,
    is_connect,
    master,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "COUNTERS",
    "DLQ_HEADERS",
    "Outcome",
    "Record",
    "Result",
    "WorkerJob",
    "WorkerProgress",
    "WorkerSummary",
    "run_workers",
    "start_workers",
]

_log = logging.getLogger(__name__)

_COUNTERS = ("received", "processed", "accepted", "released", "rejected", "dead_lettered",
             "outputs", "exhausted", "released_on_stop", "released_lock_deadline",
             "produce_failures", "ack_failures",
             # client="native" (0 with librdkafka): locks of long work renewed (RENEW)
             "renewed", "renew_failures",
             # exactly_once_outputs (0 without it): docs/workers.md, "Counters"
             "transactions", "transactions_aborted", "already_committed", "marker_wait_ms",
             "marker_conflicts", "marker_overlaps_aborted", "released_marker_wait",
             "unchecked_last_deliveries", "producers_replaced", "last_delivery_retries",
             "last_delivery_archived",
             # concurrency (issue 40; 0 without it): docs/workers.md, "Many calls in flight"
             "released_in_flight", "late_discarded", "slot_ms", "slot_capacity_ms",
             # issue 40: retries in place, the rate limit, decoding (docs/workers.md, "Counters")
             "retries", "retry_wait_ms", "rate_limit_wait_ms", "released_rate_limit",
             "undecodable",
             # issue 40: where the time goes, per phase (workers/phases.py; and MAXIMA)
             *(f"{p}_ms" for p in PHASES if p != "marker_wait"))
COUNTERS = _COUNTERS
"""The counters of every worker's report, summed in ``WorkerProgress.totals`` and
``WorkerSummary.totals`` (a worker metric each: pyspark_kafka_share.exporter.workers)."""

@dataclass(frozen=True)
class WorkerProgress:
    """A snapshot of the running workers (from their latest reports)."""

    elapsed_s: float
    totals: dict[str, int]
    workers: dict[int, dict[str, Any]]
    records_per_s: float
    """Processed records per second since the previous snapshot."""
    on_progress_failures: int = 0
    """How many calls of the job's ``on_progress`` raised so far (the first is logged)."""

    def line(self) -> str:
        t = self.totals
        if not self.workers:
            return (f"[kafka-share workers] {self.elapsed_s:6.1f}s  waiting for the workers to "
                    "start and join the share group")
        busy = sum(1 for w in self.workers.values() if w.get("state") == "running")
        return (f"[kafka-share workers] {self.elapsed_s:6.1f}s  processed={t['processed']} "
                f"({self.records_per_s:.0f}/s)  accepted={t['accepted']} "
                f"released={t['released']} rejected={t['rejected']} "
                f"dead-lettered={t['dead_lettered']}  workers running={busy}/"
                f"{len(self.workers)}  per worker=" +
                ",".join(str(self.workers[k].get("processed", 0))
                         for k in sorted(self.workers)))


@dataclass(frozen=True)
class WorkerSummary:
    """What the workers did, from every attempt's counters (an attempt that died: from its
    last report)."""

    elapsed_s: float
    stop_reason: str
    totals: dict[str, int]
    workers: list[dict[str, Any]] = field(default_factory=list)
    broker_dead_letter_topic: str | None = None
    """Where the broker dead-lettered the ``rejected`` records (its own queue, KIP-1191)."""
    on_progress_failures: int = 0
    """How many calls of ``on_progress`` raised (the first is logged at WARNING)."""

    @property
    def records_per_s(self) -> float:
        return self.totals["processed"] / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def __str__(self) -> str:
        t = self.totals
        lines = [
            f"kafka-share workers stopped ({self.stop_reason}) after {self.elapsed_s:.1f}s: "
            f"{t['processed']} records processed ({self.records_per_s:.0f}/s)",
            f"  accepted={t['accepted']} released={t['released']} rejected={t['rejected']} "
            f"dead-lettered={t['dead_lettered']} outputs={t['outputs']} "
            f"gave-up={t['exhausted']}",
            *([f"  the broker dead-lettered the {t['rejected']} rejected to "
               f"{self.broker_dead_letter_topic!r} (its dead-letter queue)"]
              if self.broker_dead_letter_topic else []),
            f"  released unprocessed: on stop={t['released_on_stop']} "
            f"at lock deadline={t['released_lock_deadline']}; produce failures="
            f"{t['produce_failures']} acknowledgement failures={t['ack_failures']}",
        ]
        if t["renewed"] or t["renew_failures"]:
            lines.append(f"  locks renewed while the function ran: {t['renewed']} "
                         f"(renewals the broker refused: {t['renew_failures']})")
        if t["transactions"] or t["transactions_aborted"]:
            lines.append(
                f"  exactly-once: transactions={t['transactions']} aborted="
                f"{t['transactions_aborted']} decided by a committed marker="
                f"{t['already_committed']} marker waits={t['marker_wait_ms']} ms "
                f"marker conflicts={t['marker_conflicts']} aborted on another's marker="
                f"{t['marker_overlaps_aborted']} released at the marker wait="
                f"{t['released_marker_wait']} unchecked last deliveries="
                f"{t['unchecked_last_deliveries']} producers replaced="
                f"{t['producers_replaced']} last deliveries retried="
                f"{t['last_delivery_retries']} last deliveries archived="
                f"{t['last_delivery_archived']}")
            if t["last_delivery_archived"]:  # lost: never silent
                lines.append(
                    f"  WARNING: {t['last_delivery_archived']} record(s) on their last delivery "
                    "were RELEASEd after their transaction was not committed and archived by "
                    "the broker, without an output or a dead letter (the workers' log names "
                    "them and why)")
        if t["slot_capacity_ms"]:
            lines.append(
                f"  concurrency: slots filled {self.slots_filled:.0%} (mean calls in flight / "
                f"concurrency while a poll was worked on); released while running="
                f"{t['released_in_flight']} late results discarded={t['late_discarded']}")
        if t["retries"] or t["released_rate_limit"] or t["rate_limit_wait_ms"] or \
                t["undecodable"]:
            lines.append(
                f"  retries in place={t['retries']} (waited {t['retry_wait_ms']} ms) "
                f"rate limit waits={t['rate_limit_wait_ms']} ms released by the rate limit="
                f"{t['released_rate_limit']} undecodable={t['undecodable']}")
        lines.extend(line for line in [phase_line(t)] if line)
        if self.on_progress_failures:
            lines.append(f"  on_progress raised {self.on_progress_failures} time(s) (the first "
                         "is logged with its traceback)")
        lost = self.failed_attempts
        if lost:
            lines.append(f"  {len(lost)} attempt(s) died; their counts are from their last "
                         "report and are included above (what they did after it is not); "
                         f"the fate of {unknown_fate(lost)} record(s) they held then is not "
                         "known (settled after that report, or back in the group when their "
                         "locks expired)")  # issue 35
        for w in self.workers:
            state = " LOST" if w.get("state") == "lost" else ""
            lines.append(f"  worker {w['worker']} (attempt {w['attempt']}, "
                         f"{w.get('host', '?')}){state}: "
                         f"processed={w.get('processed', 0)} accepted={w.get('accepted', 0)} "
                         f"released={w.get('released', 0)} rejected={w.get('rejected', 0)} "
                         f"stop={w.get('stop_reason')}")
        return "\n".join(lines)

    @property
    def slots_filled(self) -> float:
        """With ``concurrency``: the mean number of calls in flight over ``concurrency``, while
        the workers had a poll's records to work on (0 without concurrency)."""
        capacity = self.totals["slot_capacity_ms"]
        return self.totals["slot_ms"] / capacity if capacity else 0.0

    @property
    def failed_attempts(self) -> list[dict[str, Any]]:
        """Attempts whose task died (their last report before that)."""
        return [w for w in self.workers if w.get("state") == "lost"]


def _failure_reason(failure: Mapping[str, Any]) -> str:
    """The job's stop reason for a failure (issue 35): a configuration mistake or a breaker trip."""
    return "configuration mistake" if failure["kind"] == "mistake" else "circuit breaker"


def _totals(reports: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """The counters summed, the phases' maxima (``MAXIMA``) the largest."""
    out = dict.fromkeys((*_COUNTERS, *MAXIMA), 0)
    for r in reports:
        for k in _COUNTERS:
            out[k] += int(r.get(k, 0))
        for k in MAXIMA:
            out[k] = max(out[k], int(r.get(k, 0)))
    return out


class WorkerJob:
    """Running workers: :meth:`progress`, :meth:`stop`, :meth:`wait`."""

    def __init__(self, spark: Any, spec: WorkerSpec, fn: WorkerFunction, *,
                 server: DriverChannel,
                 on_progress: Callable[[WorkerProgress], None] | None) -> None:
        self._spark = spark
        self._connect = is_connect(spark)
        self._spec = spec
        self._config = spec.config
        self._workers = spec.config.workers
        self._server = server
        self._on_progress = on_progress
        self._progress_failures = 0
        self._interval = spec.config.progress_interval_s
        self._start = time.monotonic()
        self._done = threading.Event()
        self._result: list[dict[str, Any]] | None = None
        self._error: BaseException | None = None
        self._last_progress = (self._start, 0)
        self._progress_lock = threading.Lock()
        self._job_group = f"kafka-share-workers-{spec.job_id}"
        # issue 35: the job-wide circuit breaker, and why the job must stop (a failure report)
        self._breaker = JobBreaker(spec.config.circuit_breaker,
                                   spec.config.circuit_breaker_window)
        self._failure: dict[str, Any] | None = None
        task = worker_task(spec, fn)
        self._runner = threading.Thread(target=self._run, args=(task,), daemon=True,
                                        name="kafka-share-workers-job")
        self._monitor = threading.Thread(target=self._watch, daemon=True,
                                         name="kafka-share-workers-monitor")
        self._runner.start()
        self._monitor.start()

    # ---- driver threads ----------------------------------------------------------------------

    def _run(self, task: ArrowTask) -> None:
        """The job: one partition per worker, each running the worker loop; its result is every
        worker's final counters. Classic: in a job group; Connect: under a tag (both are
        thread-local, and this thread is the job's own)."""
        try:
            if self._connect:
                self._spark.addTag(self._job_group)
            else:
                self._spark.sparkContext.setJobGroup(
                    self._job_group, f"kafka-share workers: {self._workers} on "
                    f"{','.join(self._config.topics)} (group {self._config.group})",
                    interruptOnCancel=True)
            df = self._spark.range(0, self._workers, 1, self._workers) \
                .mapInArrow(task, "summary STRING")
            self._result = results_of(df.collect())
        except BaseException as exc:  # noqa: BLE001 - re-raised by wait() in the caller's thread
            self._error = explained(exc) if self._connect else exc
        finally:
            if self._connect:
                with contextlib.suppress(Exception):
                    self._spark.removeTag(self._job_group)
            self._done.set()

    def _cancel(self) -> None:
        """End the Spark job at once (its tasks are killed: they RELEASE nothing)."""
        with contextlib.suppress(Exception):
            if self._connect:
                self._spark.interruptTag(self._job_group)
            else:
                self._spark.sparkContext.cancelJobGroup(self._job_group)

    def _watch(self) -> None:
        spec = self._config
        next_progress = self._start + self._interval
        while not self._done.wait(0.25):
            now = time.monotonic()
            reports = self._server.reports()
            self._check_failures(reports.values())  # issue 35
            elapsed = now - self._start
            if spec.time_budget_s is not None and elapsed >= spec.time_budget_s:
                self._server.request_stop("time budget")
            if spec.max_records is not None and \
                    _totals(reports.values())["processed"] >= spec.max_records:
                self._server.request_stop("record count")
            latest = self._server.latest()
            if spec.idle_timeout_s is not None and elapsed >= spec.idle_timeout_s \
                    and latest and all(r.get("idle_s", 0) >= spec.idle_timeout_s
                                       or r.get("state") not in ("running", "starting")
                                       for r in latest.values()):
                self._server.request_stop("idle timeout")
            if self._on_progress is not None and now >= next_progress:
                next_progress = now + self._interval
                self._call_on_progress(self._on_progress)

    def _call_on_progress(self, on_progress: Callable[[WorkerProgress], None]) -> None:
        """The user's callback: a failure does not stop the workers; the first is logged at
        WARNING with its traceback, every one is counted (progress and summary)."""
        try:
            on_progress(self.progress())
        except Exception:  # noqa: BLE001 - the user's code: any failure is reported the same
            self._progress_failures += 1
            if self._progress_failures == 1:
                _log.warning("on_progress raised; the workers go on (later failures are "
                             "only counted: on_progress_failures in the progress and the "
                             "summary)", exc_info=True)

    def _check_failures(self, reports: Iterable[Mapping[str, Any]]) -> None:
        """Issue 35: a worker's configuration mistake or breaker trip, or the job-wide
        breaker's, stops every worker (each RELEASEs what it holds)."""
        if self._failure is not None:
            return
        reports = list(reports)
        failure = failure_of(reports)
        trip = self._breaker.observe(reports)
        if failure is None and trip is not None:
            failure = failure_report("breaker", trip.message("job-wide"))
        if failure is not None:
            self._failure = failure
            self._server.request_stop(_failure_reason(failure))

    # ---- public ------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def group(self) -> str:
        """The share group the workers consume in."""
        return self._config.group

    @property
    def failure(self) -> dict[str, Any] | None:
        """Why the job stops, if for a failure (issue 35): ``{"kind": "mistake" | "breaker",
        "message", "option"}`` (a worker's configuration mistake or breaker trip, or the
        job-wide breaker's), else None."""
        return self._failure or failure_of(self._server.reports().values())

    def reports(self) -> dict[tuple[int, int], dict[str, Any]]:
        """Every attempt's latest report by ``(worker, attempt)`` (a copy): what
        :meth:`progress` sums, read without moving its ``records_per_s`` window (for the
        worker metrics, pyspark_kafka_share.exporter.workers)."""
        return self._server.reports()

    def progress(self) -> WorkerProgress:
        with self._progress_lock:
            now = time.monotonic()
            totals = _totals(self._server.reports().values())  # every attempt's work
            t0, n0 = self._last_progress
            rate = (totals["processed"] - n0) / (now - t0) if now > t0 else 0.0
            self._last_progress = (now, totals["processed"])
            return WorkerProgress(now - self._start, totals, self._server.latest(), rate,
                                  self._progress_failures)

    def stop(self, reason: str = "stopped by user", *, wait: bool = True,
             grace_s: float = 60.0) -> WorkerSummary | None:
        """Ask every worker to stop: each finishes its current chunk and RELEASEs the rest.

        With ``wait``, waits up to ``grace_s`` and then cancels the Spark job (its job group, or
        over Spark Connect its tag; records held by a killed worker come back when their lock
        expires).
        """
        self._server.request_stop(reason)
        if not wait:
            return None
        if not self._done.wait(grace_s):
            self._cancel()
        return self.wait()

    def wait_interruptibly(self) -> WorkerSummary:
        """:meth:`wait`, where Ctrl-C stops the workers gracefully (a second Ctrl-C cancels).

        PySpark's own SIGINT handler cancels every Spark job, which kills the workers before
        they can RELEASE their records; while this waits (main thread only) ours replaces it.
        """
        if threading.current_thread() is not threading.main_thread():
            return self.wait()
        presses = 0

        def on_sigint(signum: int, frame: Any) -> None:
            nonlocal presses
            presses += 1
            if presses == 1:
                print("[kafka-share workers] stopping: each worker finishes its chunk and "
                      "RELEASEs the rest (Ctrl-C again to cancel the Spark job)",
                      file=sys.stderr, flush=True)
                self._server.request_stop("interrupted")
            else:
                self._cancel()

        previous = signal.signal(signal.SIGINT, on_sigint)
        try:
            while not self._done.wait(0.2):
                pass
        finally:
            signal.signal(signal.SIGINT, previous)
        return self.wait()

    def wait(self, timeout: float | None = None) -> WorkerSummary:
        """Wait for the workers to stop; the summary, or the job's error raised."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"the workers are still running after {timeout}s")
        self._monitor.join(1)
        self._server.close()
        if self._error is not None:
            # Issue 35: Spark gave up on a task: one line with the fix, and the summary.
            gave_up = spark_gave_up(self._error, master(self._spark), self._summary([]))
            if gave_up is not None:
                raise gave_up from self._error
            raise self._error
        assert self._result is not None
        summary = self._summary(self._result)
        failure = self._failure or failure_of(summary.workers)  # issue 35
        if failure is not None:
            raise job_error(failure, summary)
        return summary

    def _summary(self, results: list[dict[str, Any]]) -> WorkerSummary:
        workers = _attempts(results, self._server.reports())
        # The driver's reason if it stopped them; else what the workers stopped on themselves.
        # A failure names the reason whichever came first: the driver's stop or the workers'.
        own = Counter(str(w.get("stop_reason")) for w in workers if w.get("stop_reason"))
        failure = self._failure or failure_of(workers)
        reason = (_failure_reason(failure) if failure is not None else self._server.stop_reason
                  or (own.most_common(1)[0][0] if own else "job ended"))
        return WorkerSummary(elapsed_s=time.monotonic() - self._start,
                             stop_reason=reason,
                             totals=_totals(workers), workers=workers,
                             broker_dead_letter_topic=self._spec.broker_dead_letter_topic,
                             on_progress_failures=self._progress_failures)


def _attempts(results: list[dict[str, Any]],
              reports: Mapping[tuple[int, int], dict[str, Any]]) -> list[dict[str, Any]]:
    """Every attempt that ran, in (worker, attempt) order: the final counters of those whose
    task returned, the last report (state ``lost``) of those that died (killed executor or
    Python worker); attempts that never ran (``duplicate``) are left out."""
    out = {key: report if report.get("state") == "stopped" else {**report, "state": "lost"}
           for key, report in reports.items()}
    out.update({(int(r["worker"]), int(r["attempt"])): r for r in results
                if r.get("state") != DUPLICATE})
    return [out[key] for key in sorted(out)]


def _print_progress(p: WorkerProgress) -> None:
    print(p.line(), file=sys.stderr, flush=True)


def start_workers(spark: Any, fn: WorkerFunction,
                  **options: Unpack[WorkerOptions]) -> WorkerJob:
    """Start the workers and return at once; see :func:`run_workers` for the arguments."""
    on_progress = options.pop("on_progress", True)
    config = WorkerConfig.create(**options)
    check_session(spark)
    check_function(fn, config.retry_on)
    check_callables(config)  # issue 40: recoverer, deserializers
    require_pandas()
    check_python(spark)
    spec = check_environment(spark, config)
    spec = replace(spec, report_interval_s=min(1.0, config.progress_interval_s))
    _warn_if_rejects_archive(spec)  # issue 35
    server = _control_channel(spark, spec)
    spec = replace(spec, control=server.endpoint)
    printer: Callable[[WorkerProgress], None] | None
    if on_progress is True:
        printer = _print_progress
    elif on_progress is False or on_progress is None:
        printer = None
    else:
        printer = on_progress
    return WorkerJob(spark, spec, fn, server=server, on_progress=printer)


def _warn_if_rejects_archive(spec: WorkerSpec) -> None:
    """Issue 35: one WARNING line at start when a REJECT archives a record for good."""
    config = spec.config
    if config.dead_letter_topic is None and spec.broker_dead_letter_topic is None:
        logging.getLogger("pyspark_kafka_share.workers").warning(
            "kafka-share workers: group %r has no dead_letter_topic and no broker dead-letter "
            "queue: a REJECTed record (Result.reject, an exception not in retry_on, the last "
            "of max_attempts) is archived by the broker for good; pass dead_letter_topic=... "
            "to keep them", config.group)


def _control_channel(spark: Any, spec: WorkerSpec) -> DriverChannel:
    """The driver's side of the control channel: a control topic on the Kafka cluster for a
    Spark Connect session (or with ``control_topic``), else a port on the driver."""
    config = spec.config
    if is_connect(spark) or config.control_topic is not None:
        topic = config.control_topic or control_topic_name(config.group)
        clash = [n for n in ("output_topic", "dead_letter_topic") if getattr(config, n) == topic]
        if clash:
            raise OptionError("control_topic", topic, f"must differ from {clash[0]}")
        return KafkaControlServer.open(config.client, topic, spec.job_id)
    conf = spark.sparkContext.getConf()
    host = conf.get("spark.driver.host", "127.0.0.1")
    return ControlServer(host, bind_host=conf.get("spark.driver.bindAddress", host),
                         port=config.control_port,
                         max_retries=int(conf.get("spark.port.maxRetries", "16")))


def run_workers(spark: Any, fn: WorkerFunction,
                **options: Unpack[WorkerOptions]) -> WorkerSummary:
    """Run ``workers`` share consumers as Spark tasks until a stop condition; the summary.

    Arguments (keyword only; defaults and checks in :class:`WorkerConfig`): ``topics``,
    ``group`` and ``bootstrap_servers`` (required); ``workers`` (1), ``client``
    (``"librdkafka"``, confluent-kafka's share consumer; ``"native"``, the package's own:
    strict polls and RENEW for work longer than the lock), ``batch_format``,
    ``chunk_size`` (100), ``concurrency`` (1: calls of ``fn`` in flight per worker; an
    ``async def`` ``fn`` runs on an event loop, a plain one on threads), ``output_topic``,
    ``dead_letter_topic``, ``max_attempts`` (3),
    ``retry_on`` (``(Exception,)``), ``time_budget_s``, ``idle_timeout_s``, ``max_records``,
    ``starting_offsets``, ``consumer_config``, ``connection`` (a :class:`ConnectionConfig`:
    the security settings, instead of their librdkafka keys in ``consumer_config``),
    ``producer_config``, ``lock_safety_fraction`` (0.5), ``progress_interval_s`` (10),
    ``broker_timeout_s`` (30), ``control_port`` (0: a free port; the driver port the workers
    report to), ``control_topic`` (the control channel's Kafka topic: always used over Spark
    Connect, default ``kafka-share-control.<group>``; on a classic session it replaces the
    driver port), ``exactly_once_outputs`` (False), ``transaction_interval_s`` (0.1),
    ``circuit_breaker`` (0.5), ``circuit_breaker_window`` (100), ``retry_backoff`` (None: a
    :class:`Backoff` waits before retrying in the worker), ``rate_limit`` (None: records/s
    for the job, split across the workers), ``recoverer`` (None: ``retry_on``'s rule),
    ``key_deserializer`` / ``value_deserializer`` (None) and ``on_progress``.

    ``fn`` decides each record's outcome. With ``batch_format="record"`` (default) it gets one
    :class:`Record`; with ``"arrow"`` / ``"pandas"`` a ``pyarrow.Table`` / ``DataFrame`` of up to
    ``chunk_size`` rows (the ``kafka-share`` source's columns, with headers) and returns one
    result per row (or None: all ACCEPT). A result is None (ACCEPT), bytes/str (ACCEPT with that
    output value), an :class:`Outcome` or a :class:`Result`. An exception of a ``retry_on`` type
    means RELEASE (retry); any other exception means REJECT (poison). A record RELEASEd on its
    ``max_attempts``-th delivery is poison too. Poison is written to ``dead_letter_topic`` (with
    the headers in :data:`DLQ_HEADERS`) before it is REJECTed; outputs go to ``output_topic``
    and are acknowledged by the broker before the record is ACCEPTed.

    Stops when ``time_budget_s`` has passed, when no worker got a record for
    ``idle_timeout_s``, after ``max_records`` records (overshoot: at most one poll per worker),
    on Ctrl-C, or when the Spark job is cancelled. On a stop, records not yet processed are
    RELEASEd. Progress goes to ``on_progress`` (default: a line on stderr every
    ``progress_interval_s``; False: none); if it raises, the workers go on: the first failure
    is logged at WARNING with its traceback, and all are counted in
    ``WorkerSummary.on_progress_failures``.
    """
    return start_workers(spark, fn, **options).wait_interruptibly()
