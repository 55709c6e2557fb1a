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
import re
import signal
import sys
import threading
import time
import types
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pyspark_kafka_share._kafka.dlq import check_one_dead_letter_topic
from pyspark_kafka_share._kafka.group import inspect_broker, set_group_configs
from pyspark_kafka_share._spark import check_spark_python, require_pandas
from pyspark_kafka_share.errors import OptionError, SetupError, from_client_error
from pyspark_kafka_share.workers.breaker import JobBreaker
from pyspark_kafka_share.workers.config import WorkerConfig, WorkerOptions, WorkerSpec
from pyspark_kafka_share.workers.control import ControlServer, DriverChannel
from pyspark_kafka_share.workers.control_kafka import KafkaControlServer, control_topic_name
from pyspark_kafka_share.workers.eos_access import check_exactly_once_access
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

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
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

_COUNTERS = ("received", "processed", "accepted", "released", "rejected", "dead_lettered",
             "outputs", "exhausted", "released_on_stop", "released_lock_deadline",
             "produce_failures", "ack_failures",
             # exactly_once_outputs (0 without it): docs/workers.md, "Counters"
             "transactions", "transactions_aborted", "already_committed", "marker_wait_ms",
             "marker_conflicts", "released_marker_wait", "unchecked_last_deliveries",
             "producers_replaced")

@dataclass(frozen=True)
class WorkerProgress:
    """A snapshot of the running workers (from their latest reports)."""

    elapsed_s: float
    totals: dict[str, int]
    workers: dict[int, dict[str, Any]]
    records_per_s: float
    """Processed records per second since the previous snapshot."""

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
        if t["transactions"] or t["transactions_aborted"]:
            lines.append(
                f"  exactly-once: transactions={t['transactions']} aborted="
                f"{t['transactions_aborted']} decided by a committed marker="
                f"{t['already_committed']} marker waits={t['marker_wait_ms']} ms "
                f"marker conflicts={t['marker_conflicts']} released at the marker wait="
                f"{t['released_marker_wait']} unchecked last deliveries="
                f"{t['unchecked_last_deliveries']} producers replaced="
                f"{t['producers_replaced']}")
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
    def failed_attempts(self) -> list[dict[str, Any]]:
        """Attempts whose task died (their last report before that)."""
        return [w for w in self.workers if w.get("state") == "lost"]


def _totals(reports: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    out = dict.fromkeys(_COUNTERS, 0)
    for r in reports:
        for k in _COUNTERS:
            out[k] += int(r.get(k, 0))
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
            self._error = _explained(exc) if self._connect else exc
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
                with contextlib.suppress(Exception):
                    self._on_progress(self.progress())

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
            self._server.request_stop("configuration mistake" if failure["kind"] == "mistake"
                                      else "circuit breaker")

    # ---- public ------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def progress(self) -> WorkerProgress:
        with self._progress_lock:
            now = time.monotonic()
            totals = _totals(self._server.reports().values())  # every attempt's work
            t0, n0 = self._last_progress
            rate = (totals["processed"] - n0) / (now - t0) if now > t0 else 0.0
            self._last_progress = (now, totals["processed"])
            return WorkerProgress(now - self._start, totals, self._server.latest(), rate)

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
            gave_up = spark_gave_up(self._error, _master(self._spark), self._summary([]))
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
        own = Counter(str(w.get("stop_reason")) for w in workers if w.get("stop_reason"))
        reason = self._server.stop_reason or (own.most_common(1)[0][0] if own else "job ended")
        return WorkerSummary(elapsed_s=time.monotonic() - self._start,
                             stop_reason=reason,
                             totals=_totals(workers), workers=workers,
                             broker_dead_letter_topic=self._spec.broker_dead_letter_topic)


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
    _check_session(spark)
    _check_function(fn, config.retry_on)
    require_pandas()
    _check_spark_python(spark)
    spec = _check_environment(spark, config)
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
    ``group`` and ``bootstrap_servers`` (required); ``workers`` (1), ``batch_format``,
    ``chunk_size`` (100), ``output_topic``, ``dead_letter_topic``, ``max_attempts`` (3),
    ``retry_on`` (``(Exception,)``), ``time_budget_s``, ``idle_timeout_s``, ``max_records``,
    ``starting_offsets``, ``consumer_config``, ``producer_config``, ``lock_safety_fraction``
    (0.5), ``progress_interval_s`` (10), ``broker_timeout_s`` (30), ``exactly_once_outputs``
    (False), ``transaction_interval_s`` (0.1), ``circuit_breaker`` (0.5),
    ``circuit_breaker_window`` (100) and ``on_progress``.

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
    ``progress_interval_s``).

    A failure of the job rather than of a record (issue 35) stops every worker, RELEASEs what
    they hold and raises, with the summary: a result the configuration cannot honour
    (:class:`~pyspark_kafka_share.errors.ConfigurationMistakeError`), the circuit breaker
    (:class:`~pyspark_kafka_share.errors.CircuitBreakerError`), Spark giving up on a task
    (:class:`~pyspark_kafka_share.errors.SparkGaveUpError`).
    """
    return start_workers(spark, fn, **options).wait_interruptibly()


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session: PySpark's Connect class, or a session
    with no SparkContext on this side that can tag and interrupt its jobs."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return True
    try:
        spark.sparkContext  # noqa: B018 - Spark Connect raises here
    except Exception:  # noqa: BLE001
        return all(hasattr(spark, name) for name in ("addTag", "interruptTag", "range"))
    return False


def _check_session(spark: Any) -> None:
    if is_connect(spark):
        return
    try:
        spark.sparkContext  # noqa: B018
    except Exception as exc:  # noqa: BLE001
        raise OptionError("spark", type(spark).__name__, "pass a SparkSession, classic or "
                          f"Spark Connect (SparkSession.builder.remote(...)) ({exc})") from None


def _master(spark: Any) -> str:
    """The session's master URL (over Connect: the server's ``spark.master``; "" unknown)."""
    with contextlib.suppress(Exception):
        return str(spark.sparkContext.master)
    with contextlib.suppress(Exception):
        return str(spark.conf.get("spark.master", None) or "")
    return ""


def _check_spark_python(spark: Any) -> None:
    """The Python Spark starts for its workers can import the package: checked where those
    run on this machine. Over Spark Connect only when the Connect server runs in this process
    (``remote("local[...]")``); a remote server's Python is checked when the job starts
    (:func:`_explained`)."""
    if not is_connect(spark):
        check_spark_python(spark)
        return
    from pyspark import SparkContext

    local = SparkContext._active_spark_context
    if local is not None and str(local.master) == _master(spark):
        check_spark_python(types.SimpleNamespace(sparkContext=local))


def _explained(exc: BaseException) -> BaseException:
    """A Connect job's error, as a :class:`SetupError` when the server's Python workers lack
    the package (the client cannot check a remote server's Python beforehand)."""
    text = str(exc)
    if "No module named 'pyspark_kafka_share'" in text or \
            "No module named \"pyspark_kafka_share\"" in text:
        error = SetupError(
            "the Spark Connect server's Python workers cannot import pyspark_kafka_share: "
            "install it on the server and its executors (pip install pyspark-kafka-share; "
            "docs/deployment.md)")
        error.__cause__ = exc
        return error
    return exc


def _check_function(fn: object, retry_on: tuple[type[BaseException], ...]) -> None:
    """``fn`` and ``retry_on``: checked before anything is changed."""
    if not callable(fn):
        raise OptionError("fn", fn, "pass a function of one record (or one batch)")
    from pyspark import cloudpickle

    try:
        cloudpickle.dumps((fn, retry_on))  # type: ignore[no-untyped-call]
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the same user error
        raise OptionError(
            "fn", fn, f"cannot be pickled to the executors ({type(exc).__name__}: {exc}); "
            "create clients such as model sessions or HTTP pools inside the function (e.g. "
            "cached in a module-level variable), not in the enclosing scope") from None


def _check_environment(spark: Any, config: WorkerConfig) -> WorkerSpec:
    """Task slots, the broker, the topics and the group: checked before any task starts;
    then the group's ``share.auto.offset.reset`` is set from ``starting_offsets``."""
    slots = _task_slots(spark)
    if slots is not None and config.workers > slots:
        why = (f"Spark has {slots} task slots, and every worker is a task that runs until it "
               "stops: the extra workers would only start when others end")
        if _master(spark).startswith("local"):
            raise OptionError("workers", config.workers, f"{why}. Lower workers, or give Spark "
                              f"more slots (master local[{config.workers}])")
        # On a cluster defaultParallelism may be stale (executors still registering).
        warnings.warn(f"workers={config.workers}: {why} (if defaultParallelism is current)",
                      stacklevel=4)
    facts = inspect_broker(config.client, config.topics, bootstrap_name="bootstrap_servers",
                           topics_name="topics")
    if config.max_attempts > facts.delivery_limit:
        raise OptionError(
            "max_attempts", config.max_attempts,
            f"the broker archives a record after {facts.delivery_limit} deliveries (group "
            f"config share.delivery.count.limit of {config.group!r}), so it would never reach "
            f"attempt {config.max_attempts}. Lower max_attempts or raise the group's limit")
    _check_out_topics(config)
    if config.exactly_once_outputs:  # every ACL it needs, used once
        check_exactly_once_access(config.client, config.producer_settings(),
                                  [t for t in (config.output_topic, config.dead_letter_topic)
                                   if t is not None])
    broker_dlq = check_one_dead_letter_topic(config.client, "dead_letter_topic",
                                             config.dead_letter_topic)
    if config.starting_offsets is not None:
        set_group_configs(config.client, {"share.auto.offset.reset": config.starting_offsets},
                          option="starting_offsets")
    return WorkerSpec(config=config, lock_ms=facts.lock_ms, delivery_limit=facts.delivery_limit,
                      job_id=uuid.uuid4().hex[:12],
                      broker_dead_letter_topic=broker_dlq.topic if broker_dlq.active else None)


def _task_slots(spark: Any) -> int | None:
    """Spark's task slots (``defaultParallelism / spark.task.cpus``). Over Spark Connect: of
    the server in this process (``remote("local[...]")``), else of a ``local[N]`` master only
    (a Connect client cannot read ``defaultParallelism``); None when not known."""
    from pyspark import SparkContext

    try:
        return _slots_of(spark.sparkContext)
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext: see below
        pass
    master = _master(spark)
    local = SparkContext._active_spark_context
    if local is not None and str(local.master) == master:
        return _slots_of(local)
    match = re.fullmatch(r"local(?:\[\s*(\d+)\s*(?:,\s*\d+\s*)?\])?", master)
    if match is None:
        return None
    try:
        cpus = int(spark.conf.get("spark.task.cpus", None) or 1)
    except Exception:  # noqa: BLE001
        cpus = 1
    return int(match.group(1) or 1) // max(cpus, 1)


def _slots_of(sc: Any) -> int:
    cpus = int(sc.getConf().get("spark.task.cpus", "1"))
    return int(sc.defaultParallelism) // max(cpus, 1)


def _check_out_topics(config: WorkerConfig) -> None:
    """The output and dead-letter topics exist, seen by a producer with the workers' settings
    (so security settings are checked too)."""
    wanted = {"output_topic": config.output_topic,
              "dead_letter_topic": config.dead_letter_topic}
    wanted = {k: v for k, v in wanted.items() if v is not None}
    if not wanted:
        return
    from confluent_kafka import Producer

    try:
        md = Producer(config.producer_settings()).list_topics(timeout=config.broker_timeout_s)
    except Exception as exc:
        raise from_client_error(
            exc, f"a producer with the workers' settings cannot reach {config.bootstrap_servers}",
            "Check consumer_config/producer_config") from exc
    for name, t in wanted.items():
        if t not in md.topics or md.topics[t].error is not None:
            raise OptionError(name, t, f"topic does not exist on {config.bootstrap_servers}; "
                              "create it first")
