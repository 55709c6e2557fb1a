"""The moving parts of the chaos test: a steady producer, the supervised streaming query, the
faults themselves, and the ground truth the sink is checked against.

- :class:`SteadyProducer`: a thread producing numbered records (values ``b"0"``, ``b"1"``,
  ...) at a steady rate, idempotent and patient enough to ride out broker outages.
- :class:`ChaosQuery`: the ``kafka-share`` → Parquet file sink query (checkpoint + journal);
  starts, stops, restarts after a failure, and restarts with a ``_faultInjection`` option
  aimed at the next new batch.
- :func:`kill_busy_worker`: SIGKILL of a PySpark Python worker of this process's Spark that
  is running a task (found in ``/proc``: children of the ``pyspark.daemon pyspark.worker``
  daemon under our own JVM, the busiest by CPU).
- :class:`SparkTasks`: failed task attempts as Spark's status tracker reports them.
- :func:`read_log`, :func:`group_lag`, :func:`sink_rows`: what the topic holds, the group's
  lag, what the sink holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from pyspark_kafka_share._kafka.connection import ConnectionConfig
from pyspark_kafka_share._kafka.produce import produce
from pyspark_kafka_share.admin import ShareGroupAdmin
from pyspark_kafka_share.harness import LocalKafka, LocalKafkaCluster
from pyspark_kafka_share.workers.config import ShareClient

Log = Callable[[str], None]
Key = tuple[int, int]  # (partition, offset) in the one chaos topic

# -- the group ---------------------------------------------------------------------------------


def configure_group(kafka: LocalKafka | LocalKafkaCluster, group: str,
                    configs: Mapping[str, str | int], log: Log) -> None:
    """Set the group's dynamic configs. ``share.delivery.count.limit`` is a group config from
    Kafka 4.3 on (KIP-1240): a 4.2 broker refuses the name, and the broker's default
    (``group.share.delivery.count.limit``, set when the broker starts) applies instead."""
    for key, value in configs.items():
        try:
            kafka.set_group_config(group, key, value)
        except Exception as exc:
            if key != "share.delivery.count.limit" or "Unknown group config" not in str(exc):
                raise
            log(f"  {key}={value} not a group config on Kafka {kafka.version}: the broker's "
                "default applies")


# -- the producer ------------------------------------------------------------------------------


class SteadyProducer:
    """Produces numbered records to ``topic`` at a steady ``rate`` (records/s), from
    :meth:`start` until :meth:`finish` has been called *and* at least ``minimum`` records were
    produced.

    Record ``i`` has value ``str(i)`` and goes to partition ``i % partitions``. The producer
    is idempotent with ``acks=all`` and a 10-minute delivery timeout, so it rides out broker
    crashes: records are retried, never written twice. ``delivered`` maps each value to the
    (partition, offset) its delivery report gave; ``errors`` lists failed deliveries.
    ``config``: more client settings (a secured listener's).
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float,
                 minimum: int, *, config: Mapping[str, Any] | None = None) -> None:
        self.bootstrap = bootstrap
        self.config = dict(config or {})
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.minimum = minimum
        self.delivered: dict[int, Key] = {}
        self.errors: list[str] = []
        self.produced = 0  # handed to the client so far
        self.failure: BaseException | None = None
        self._finish = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self) -> None:
        """Stop producing (once ``minimum`` records are produced)."""
        self._finish.set()

    def join(self, timeout_s: float) -> None:
        """Wait until every record is produced and delivered (or failed)."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise AssertionError(f"the producer did not finish within {timeout_s:.0f}s: "
                                 f"{self.produced} produced, {len(self.delivered)} delivered")
        if self.failure is not None:
            raise AssertionError(f"the producer failed: {self.failure!r}") from self.failure

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
            return
        self.delivered[int(msg.value())] = (msg.partition(), msg.offset())

    def _run(self) -> None:
        from confluent_kafka import Producer

        try:
            producer = Producer({
                **self.config, "bootstrap.servers": self.bootstrap, "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5, "message.timeout.ms": 600_000, "log_level": 0,
            })
            start = time.monotonic()
            while not (self._finish.is_set() and self.produced >= self.minimum):
                due = int((time.monotonic() - start) * self.rate) + 1
                while self.produced < due:
                    i = self.produced
                    produce(producer, self.topic, b"%d" % i, partition=i % self.partitions,
                            on_delivery=self._on_delivery, timeout_s=600)
                    self.produced += 1
                producer.poll(0.05)
            deadline = time.monotonic() + 600
            while producer.flush(1.0) and time.monotonic() < deadline:
                pass
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.failure = exc


# -- Spark's view: failed task attempts --------------------------------------------------------


class SparkTasks:
    """Failed task attempts of the chaos queries, from Spark's status tracker.

    Streaming queries run their jobs in a job group named by the run id; a run's jobs and
    stages stay in the tracker up to ``spark.ui.retainedJobs`` (1,000), failed attempts
    included. A finished job's count is kept here, so the total does not fall when the tracker
    forgets old jobs (a long run has more than 1,000 batches).
    """

    def __init__(self, spark: SparkSession) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.run_ids: list[str] = []
        self._done: dict[int, int] = {}  # finished job -> its failed task attempts

    def failed(self) -> int:
        total = 0
        for run_id in self.run_ids:
            for job_id in self.tracker.getJobIdsForGroup(run_id):
                if job_id in self._done:
                    continue
                job = self.tracker.getJobInfo(job_id)
                if job is None:
                    continue
                failed = sum(s.numFailedTasks for s in
                             (self.tracker.getStageInfo(i) for i in job.stageIds) if s)
                if job.status in ("SUCCEEDED", "FAILED"):
                    self._done[job_id] = failed
                else:
                    total += failed
        return total + sum(self._done.values())

    def running_tasks(self) -> int:
        stages = (self.tracker.getStageInfo(i) for i in self.tracker.getActiveStageIds())
        return sum(s.numActiveTasks for s in stages if s)


# -- the query ---------------------------------------------------------------------------------


@dataclass
class BatchTotals:
    """Sums of the source's per-batch metrics (END-marker stats, ``lastBatch`` in progress)."""

    batches: dict[int, dict[str, int]] = field(default_factory=dict)

    def add_progress(self, progress: list[Any]) -> None:
        for p in progress:
            for source in p.sources:
                report = json.loads(source.latestOffset or "{}") or {}
                last = report.get("lastBatch") or {}
                if "batch" in last:
                    self.batches[int(last["batch"])] = last

    def total(self, key: str) -> int:
        return sum(int(b.get(key, 0)) for b in self.batches.values())


class ChaosQuery:
    """The streaming query under test: ``kafka-share`` → Parquet file sink, exactly-once.

    Its checkpoint, journal and output live under ``root``; every start uses the same ones.
    ``clients``: the source's share consumer (its ``client`` option), start after start in
    turn (``make chaos-scale`` alternates both on one checkpoint and journal).
    """

    def __init__(self, spark: SparkSession, kafka: LocalKafka, topic: str, group: str, root: Path,
                 tasks: int, tasks_view: SparkTasks, log: Log,
                 clients: tuple[ShareClient, ...] = ("librdkafka",)) -> None:
        self.spark = spark
        self.clients = clients
        self.starts_by_client = Counter[str]()
        self.kafka = kafka
        self.topic = topic
        self.group = group
        self.journal = root / "journal"
        self.checkpoint = root / "checkpoint"
        self.out = root / "out"
        self.tasks = tasks
        self.tasks_view = tasks_view
        self.log = log
        self.query: Any = None
        self.starts = 0
        self.failures: list[str] = []  # how each failed run ended
        self.metrics = BatchTotals()
        self._last_progress: tuple[str, int] | None = None

    def start(self, fault: str | None = None, timeout_s: float = 180) -> None:
        """Start from the checkpoint; a start that fails (broker still recovering) is retried."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.query = self._start(fault)
                break
            except Exception as exc:
                if time.monotonic() > deadline:
                    raise
                self.log(f"  query start failed, retrying: {_first_line(exc)}")
                time.sleep(2)
        self.starts_by_client[self.client] += 1
        self.starts += 1
        self.tasks_view.run_ids.append(str(self.query.runId))

    @property
    def client(self) -> ShareClient:
        """The ``client`` option of the next start (:meth:`start` counts it afterwards)."""
        return self.clients[self.starts % len(self.clients)]

    def _start(self, fault: str | None) -> Any:
        reader = (self.spark.readStream.format("kafka-share")
                  .option("kafka.bootstrap.servers", self.kafka.bootstrap_servers)
                  .option("kafka.group.id", self.group)
                  .option("subscribe", self.topic)
                  .option("journalPath", str(self.journal))
                  .option("numPartitions", self.tasks)
                  .option("client", self.client)
                  .option("maxBatchDurationMs", 3000))
        if fault:
            reader = reader.option("_faultInjection", fault)
        return (reader.load().writeStream.format("parquet")
                .option("path", str(self.out))
                .option("checkpointLocation", str(self.checkpoint))
                .trigger(processingTime="1 second").start())

    def stop(self) -> None:
        if self.query is not None:
            self.query.stop()
            self.collect_metrics()

    def restart(self, fault_at_next_batch: str | None = None, pause_s: float = 0.0) -> str:
        """Stop, wait ``pause_s``, start again; the fault (a ``_faultInjection`` item without
        ``seq``) is aimed at the first batch the new run plans. Returns the option used."""
        self.stop()
        time.sleep(pause_s)
        fault = f"{fault_at_next_batch}:seq={self.next_seq()}" if fault_at_next_batch else None
        self.start(fault)
        return fault or "-"

    def _newest(self, log: str) -> int:
        """The newest Spark batch id in the checkpoint's ``offsets`` or ``commits`` log (-1:
        none)."""
        directory = self.checkpoint / log
        ids = [int(p.name) for p in directory.iterdir() if p.name.isdigit()] \
            if directory.exists() else []
        return max(ids, default=-1)

    def planned(self) -> int:
        """The newest batch Spark planned (wrote to its offset log), -1 if none."""
        return self._newest("offsets")

    def committed(self) -> int:
        """The newest batch Spark committed (sink written, commit log entry), -1 if none."""
        return self._newest("commits")

    def next_seq(self) -> int:
        """The source's batch number (``seq``) of the first batch a restart plans.

        Spark batch ``b`` runs source batch ``seq = b + 1``. A restart first re-runs the last
        batch of the offset log if it is not committed, so the first *new* batch is the one
        after the newest batch in the offset log.
        """
        return self.planned() + 2

    def ensure_running(self) -> None:
        """Restart the query if it died (a batch out of task retries, e.g. during an outage)."""
        if self.query is None:
            return
        self._print_progress()
        if self.query.isActive:
            return
        exc = self.query.exception()
        self.collect_metrics()
        reason = _first_line(exc) if exc is not None else "stopped"
        self.failures.append(reason)
        self.log(f"  query run ended ({reason}); restarting from the checkpoint")
        self.start()

    def _print_progress(self) -> None:
        """One line per finished micro-batch on stdout (shown by pytest on failure or -s)."""
        with contextlib.suppress(Exception):
            p = self.query.lastProgress
            if p is None or (str(self.query.runId), p.batchId) == self._last_progress:
                return
            self._last_progress = (str(self.query.runId), p.batchId)
            print(f"    batch {p.batchId}: {p.numInputRows} rows in "
                  f"{p.durationMs.get('triggerExecution', 0) / 1000:.1f}s "
                  f"(run {self.starts}, {p.timestamp})", flush=True)

    def collect_metrics(self) -> None:
        if self.query is not None:
            try:
                self.metrics.add_progress(self.query.recentProgress)
            except Exception as exc:  # noqa: BLE001 - metrics are evidence, not the verdict
                self.log(f"  could not read the query's progress: {exc!r}")


def _first_line(exc: object) -> str:
    """The line of an error that says what happened: for a Python worker's traceback, the
    last ``SomeError: ...`` line; else the first line."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    text = named[-1] if named else lines[0] if lines else repr(exc)
    return text[:240]


# -- faults ------------------------------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, list[str], int]]:
    """pid -> (parent pid, argv, utime + stime in clock ticks) of every visible process."""
    table: dict[int, tuple[int, list[str], int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        table[int(name)] = (int(fields[1]), argv, int(fields[11]) + int(fields[12]))
    return table


def task_workers() -> dict[int, int]:
    """Python workers that run Spark tasks, under this process only: pid -> CPU ticks.

    PySpark forks them from the daemon ``python -m pyspark.daemon pyspark.worker`` (the
    planner and data-source daemons run other modules), which our SparkSubmit JVM started.
    """
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    mine: set[int] = set()
    todo = [os.getpid()]
    while todo:
        for child in children.get(todo.pop(), []):
            mine.add(child)
            todo.append(child)

    def is_worker_daemon_image(pid: int) -> bool:
        return table[pid][1][-2:] == ["pyspark.daemon", "pyspark.worker"]

    return {pid: table[pid][2] for pid in mine
            if is_worker_daemon_image(pid) and table[pid][0] in mine
            and is_worker_daemon_image(table[pid][0])}


def kill_busy_worker(tasks: SparkTasks, victim: int, wait_s: float = 20.0) -> str:
    """SIGKILL a Python worker while it runs a task; what happened, for the log.

    Waits (up to ``wait_s``) for a running task, then takes the workers that used CPU in the
    next half second (those running tasks; idle reused workers block on a socket) and kills
    the ``victim``-th of them (mod their number).
    """
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if tasks.running_tasks() == 0:
            time.sleep(0.2)
            continue
        before = task_workers()
        time.sleep(0.5)
        after = task_workers()
        busy = sorted(pid for pid in after if pid in before and after[pid] > before[pid])
        if not busy:
            continue
        pid = busy[victim % len(busy)]
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue  # it ended meanwhile: pick again
        return f"SIGKILLed Python worker {pid} (busy: {busy}, workers: {sorted(after)})"
    return f"no busy Python worker within {wait_s:.0f}s: nothing killed"


def crash_broker(kafka: LocalKafka, down_s: float, log: Log) -> str:
    """SIGKILL the broker, keep it down ``down_s`` seconds, restart it on the same data."""
    kafka.kill()
    time.sleep(down_s)
    started = time.monotonic()
    for attempt in range(3):
        try:
            kafka.restart()
            break
        except Exception as exc:
            if attempt == 2:
                raise
            log(f"  broker restart failed, again: {_first_line(exc)}")
    return f"broker killed, down {down_s:.1f}s, back after {time.monotonic() - started:.1f}s"


# -- ground truth ------------------------------------------------------------------------------


def read_log(bootstrap: str, topic: str, partitions: int) -> dict[Key, int]:
    """Every record the topic holds: (partition, offset) -> its number, read from offset 0 to
    the high watermark with a plain (non-share) consumer."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "chaos-log-reader",
                         "enable.auto.commit": False, "log_level": 0})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
                for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out: dict[Key, int] = {}
        reached = dict.fromkeys(ends, 0)  # next offset to read, per partition
        deadline = time.monotonic() + 300
        while any(reached[p] < ends[p] for p in ends):
            if time.monotonic() > deadline:
                raise AssertionError(f"could not read {topic!r} to its end: {reached} of {ends}")
            for m in consumer.consume(10_000, 1.0):
                partition, offset, value = m.partition(), m.offset(), m.value()
                if m.error() is None and partition is not None and offset is not None \
                        and value is not None and offset < ends[partition]:
                    out[(partition, offset)] = int(value)
                    reached[partition] = offset + 1
        return out
    finally:
        consumer.close()


def group_lag(bootstrap: str, group: str, topic: str,
              connection: ConnectionConfig | None = None) -> dict[int, int | None]:
    """The share group's lag per partition of ``topic`` (None: no share state or unknown)."""
    with ShareGroupAdmin(bootstrap, connection=connection, timeout_s=15) as admin:
        return {o.partition: o.lag for o in admin.offsets(group) if o.topic == topic}


@dataclass(frozen=True)
class SinkRow:
    partition: int
    offset: int
    value: int
    delivery_count: int


def sink_rows(spark: SparkSession, out: Path) -> list[SinkRow]:
    """What the file sink committed (its metadata log decides which files count)."""
    if not (out / "_spark_metadata").exists():
        return []
    rows = spark.read.parquet(str(out)).select(
        "partition", "offset", "value", "deliveryCount").collect()
    return [SinkRow(r.partition, r.offset, int(bytes(r.value)), r.deliveryCount) for r in rows]


def sink_count(spark: SparkSession, out: Path) -> int:
    if not (out / "_spark_metadata").exists():
        return 0
    return int(spark.read.parquet(str(out)).count())
