"""The contenders: each drains a topic (or follows a live one) once and returns a :class:`Run`.

Every run checks its record count and raises :class:`BenchError` when a contender read fewer or
more records than were produced: a fast wrong answer is not a result.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark_kafka_share._kafka.produce import produce
from pyspark_kafka_share.harness import LocalKafka, ProducerRecord

VALUE_BYTES = 200
KEY_SPACE = 100_000  # keys b"k00000".."k99999": 6 bytes, spread evenly over partitions
KEY_BYTES = 6

# Producer settings of the datasets. The broker hands a share consumer whole producer batches,
# so batch.size also sets how many records one ShareFetch acquires (about 300 here).
PRODUCER_CONFIG: dict[str, str | int] = {
    "linger.ms": 20,
    "batch.size": 65_536,
    "acks": "all",
    "enable.idempotence": "true",
    "compression.type": "none",
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1_048_576,
}
# The paced producer of the latency runs sends each record as soon as it can.
LATENCY_PRODUCER_CONFIG: dict[str, str | int] = {
    "linger.ms": 5, "acks": "all", "enable.idempotence": "true",
}
# kafka-share options of the latency runs: a task polls for at most maxBatchDurationMs, and
# rows reach the sink only after the task ends, so this bounds the batch-induced latency.
LATENCY_SHARE_OPTIONS = {"maxBatchDurationMs": "500", "pollTimeoutMs": "200",
                         "client": "librdkafka"}
"""The latency suite's tuned kafka-share cases. They name librdkafka, as they were measured
before the source's default became the native client; ``share-eo-defaults`` takes the
defaults, native included."""
SOURCE_SPREAD_ARROW_BATCH = 1_000
"""Rows per Arrow batch into the source spread's mapInArrow (1 s of its work at 1 ms/record):
with Spark's default of 10,000, a task's first batch is its whole share."""


class BenchError(RuntimeError):
    """A contender failed or read a wrong number of records."""


@dataclass
class Run:
    """One measurement of one contender."""

    suite: str
    case: str
    round: int
    records: int
    record_bytes: int
    wall_s: float
    steady_s: float | None
    params: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rps_wall(self) -> float:
        return self.records / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def rps_steady(self) -> float | None:
        if self.steady_s is None or self.steady_s <= 0:
            return None
        return self.records / self.steady_s

    def as_dict(self) -> dict[str, Any]:
        steady = self.rps_steady
        return {
            "suite": self.suite, "case": self.case, "round": self.round,
            "records": self.records, "record_bytes": self.record_bytes,
            "wall_s": round(self.wall_s, 3),
            "steady_s": None if self.steady_s is None else round(self.steady_s, 3),
            "records_per_s_wall": round(self.rps_wall, 1),
            "records_per_s_steady": None if steady is None else round(steady, 1),
            "mb_per_s_wall": round(self.rps_wall * self.record_bytes / 1e6, 3),
            "mb_per_s_steady": None if steady is None
            else round(steady * self.record_bytes / 1e6, 3),
            "params": self.params, "extra": self.extra,
        }


def fresh_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- datasets ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dataset:
    """A topic holding ``records`` records of ``VALUE_BYTES``-byte values and small keys."""

    name: str
    topic: str
    partitions: int
    records: int

    @property
    def record_bytes(self) -> int:
        return VALUE_BYTES + KEY_BYTES


def _values(n: int) -> Iterator[tuple[bytes, bytes]]:
    filler = bytes((i * 7 + 13) % 256 for i in range(VALUE_BYTES - 12))
    for i in range(n):
        yield b"k%05d" % (i % KEY_SPACE), b"%012d" % i + filler


def _high_watermarks(bootstrap: str, topic: str, partitions: int) -> list[int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": fresh_name("bench-wm")})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)]
    finally:
        consumer.close()


def produce_dataset(kafka: LocalKafka, name: str, partitions: int, records: int) -> tuple[
        Dataset, dict[str, Any]]:
    """Create a fresh topic and fill it as fast as the Python producer goes."""
    from confluent_kafka import KafkaError, Producer

    topic = kafka.create_topic(fresh_name(f"bench-{name}"), partitions)
    failed: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, **PRODUCER_CONFIG,
                         "error_cb": failed.append})
    start = time.monotonic()
    for i, (key, value) in enumerate(_values(records)):
        produce(producer, topic, value, key=key, timeout_s=120)
        if i % 20_000 == 0:
            producer.poll(0)
    left = producer.flush(120)
    seconds = time.monotonic() - start
    marks = _high_watermarks(kafka.bootstrap_servers, topic, partitions)
    if left or sum(marks) != records:
        raise BenchError(f"producing {records} records to {topic} failed: {left} undelivered, "
                         f"offsets {marks}, errors {failed[:3]}")
    info = {"topic": topic, "partitions": partitions, "records": records,
            "per_partition": marks, "produce_s": round(seconds, 2),
            "produce_records_per_s": round(records / seconds, 1)}
    return Dataset(name, topic, partitions, records), info


# -- the raw clients --------------------------------------------------------------------------


def python_client(kafka: LocalKafka, data: Dataset, *, threads: int, commit: str,
                  idle_timeout_s: float = 30.0) -> tuple[int, float, float, dict[str, Any]]:
    """Drain ``data`` with ``threads`` explicit-mode ``ShareConsumer``s, one per thread.

    Per poll: acknowledge every record with ACCEPT, then ``commit_sync`` (``commit="sync"``,
    what the source does) or ``commit_async`` (``"async"``: acknowledgements also ride on the
    next poll). Returns (records, wall seconds from creating the consumers until the last record
    was acknowledged, seconds from the first record to the last, extra).
    """
    from confluent_kafka import AcknowledgeType, ShareConsumer

    group = fresh_name("bench-py")
    kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
    lock = threading.Lock()
    state: dict[str, Any] = {"count": 0, "first": None, "last": None, "polls": 0,
                             "commit_failures": 0}
    done = threading.Event()
    errors: list[BaseException] = []

    def drain(index: int) -> None:
        consumer = ShareConsumer({
            "bootstrap.servers": kafka.bootstrap_servers, "group.id": group,
            "share.acknowledgement.mode": "explicit", "client.id": f"bench-py-{index}",
        })
        try:
            consumer.subscribe([data.topic])
            idle_since = time.monotonic()
            while not done.is_set():
                msgs = consumer.poll(0.2)
                now = time.monotonic()
                if not msgs:
                    if now - idle_since > idle_timeout_s:
                        return
                    continue
                idle_since = now
                for m in msgs:
                    if m.error() is not None:
                        raise BenchError(f"poll returned an error: {m.error()}")
                    consumer.acknowledge(m, AcknowledgeType.ACCEPT)
                failures = 0
                if commit == "sync":
                    results = consumer.commit_sync(30.0)
                    failures = sum(1 for err in results.values() if err is not None)
                else:
                    consumer.commit_async()
                now = time.monotonic()
                with lock:
                    state["count"] += len(msgs)
                    state["polls"] += 1
                    state["commit_failures"] += failures
                    state["first"] = state["first"] or now
                    state["last"] = now
                    if state["count"] >= data.records:
                        done.set()
            if commit == "async":
                consumer.commit_sync(30.0)  # flush the last acknowledgements before closing
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(exc)
            done.set()
        finally:
            consumer.close()

    start = time.monotonic()
    workers = [threading.Thread(target=drain, args=(i,), name=f"bench-py-{i}", daemon=True)
               for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise BenchError(f"python client failed: {errors[0]!r}") from errors[0]
    count = int(state["count"])
    if count != data.records or state["first"] is None:
        raise BenchError(f"python client read {count} records, expected {data.records}")
    wall = state["last"] - start
    steady = state["last"] - state["first"]
    extra = {"polls": state["polls"], "records_per_poll": round(count / state["polls"], 1),
             "commit_failures": state["commit_failures"],
             "join_s": round(state["first"] - start, 2)}
    return count, wall, steady, extra


def _perf_time(text: str) -> float:
    from datetime import datetime

    return datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S:%f").timestamp()


def java_perf(kafka: LocalKafka, data: Dataset, *, threads: int) -> tuple[
        int, float, float, dict[str, Any]]:
    """Kafka's ``ShareConsumerPerformance`` (Java client, implicit acknowledgement).

    Returns (records, wall seconds of the tool's JVM including its start, the tool's own
    start-to-end seconds, extra). The tool's clock starts before its consumers join.
    """
    group = fresh_name("bench-java")
    kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
    start = time.monotonic()
    proc = kafka.run_tool(
        "ShareConsumerPerformance", "--bootstrap-server", kafka.bootstrap_servers,
        "--topic", data.topic, "--group", group, "--num-records", str(data.records),
        "--threads", str(threads), "--timeout", "30000", "--hide-header",
        timeout_s=600.0,
    )
    wall = time.monotonic() - start
    # "start.time, end.time, data.consumed.in.MB, MB.sec, nMsg.sec, data.consumed.in.nMsg,
    #  fetch.time.ms": the total line is the one not prefixed by "Share consumer N ...".
    total = None
    for line in proc.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 7 and fields[0][:2] == "20" and fields[0][4:5] == "-":
            total = fields
    if total is None:
        raise BenchError(f"no result line in ShareConsumerPerformance output:\n"
                         f"{proc.stdout[-2000:]}")
    count = int(total[5])
    tool_s = _perf_time(total[1]) - _perf_time(total[0])
    if count != data.records:
        raise BenchError(f"ShareConsumerPerformance read {count} records, "
                         f"expected {data.records}")
    return count, wall, tool_s, {"tool_mb": float(total[2]), "tool_records_per_s":
                                 float(total[4]), "tool_fetch_ms": int(total[6])}


# -- Spark ------------------------------------------------------------------------------------


def _sleeper(cost_s: float, stamps: str) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A mapInArrow function costing ``cost_s`` seconds per row (a stand-in for real work).

    Each call (one per task) leaves a line in a file under ``stamps``: when its first rows
    arrived, when it finished its last, how many rows it got, and which Python worker ran it
    (its pid, and its age when the first rows arrived: a worker Spark has just started is
    seconds old, a pooled one has run earlier tasks).
    """
    process_age_s = _age_probe()

    def work(batches: Iterator[Any]) -> Iterator[Any]:
        import json as _json
        import os as _os
        import time as _time
        import uuid as _uuid

        from pyspark import TaskContext

        ctx = TaskContext.get()
        task = ctx.partitionId() if ctx is not None else -1
        first = last = None
        age = None
        rows = 0
        for batch in batches:
            if first is None:
                first = _time.time()
                age = process_age_s()
            _time.sleep(cost_s * batch.num_rows)
            rows += batch.num_rows
            last = _time.time()
            yield batch
        if first is not None:
            path = _os.path.join(stamps, _uuid.uuid4().hex)
            with open(path, "w") as f:
                f.write(_json.dumps({"first": first, "last": last, "rows": rows,
                                     "task": task, "pid": _os.getpid(), "age": age}))

    return work


def _age_probe() -> Callable[[], float | None]:
    """A function giving the seconds since its process started (Linux's /proc; None
    elsewhere). Local, so that cloudpickle ships it by value with the functions that call it
    (bench/ is not on the Python workers' path)."""

    def process_age_s() -> float | None:
        import os as _os

        try:
            with open("/proc/self/stat") as f:
                # field 22: starttime, clock ticks after boot (field 2, the name, may hold spaces)
                start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
            with open("/proc/uptime") as f:
                uptime = float(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return round(uptime - start_ticks / _os.sysconf("SC_CLK_TCK"), 2)

    return process_age_s


def _warmer() -> Callable[[Iterator[Any]], Iterator[Any]]:
    """A task of :meth:`SparkBench.warm_python_workers`: imports what a queue worker's task
    imports, waits for its barrier's other tasks (so each runs in a Python worker of its own)
    and yields its pid and the age of its process."""
    process_age_s = _age_probe()

    def warm(batches: Iterator[Any]) -> Iterator[Any]:
        import os as _os

        import pyarrow as _pa
        from pyspark import BarrierTaskContext

        import pyspark_kafka_share.workers  # noqa: F401 - imported for its cost, as a worker does

        for _ in batches:
            pass
        BarrierTaskContext.get().barrier()
        yield _pa.RecordBatch.from_pylist([{"pid": _os.getpid(), "age": process_age_s()}])

    return warm


def _stat(pid: str) -> tuple[int, float]:
    """(parent pid, start in clock ticks after boot) of process ``pid`` (field 2 of
    /proc/<pid>/stat, the name, may hold spaces)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[19])


def _fresh_python_workers(since_s: float) -> int | None:
    """How many of this run's Spark Python worker processes that run tasks (``pyspark.daemon
    pyspark.worker`` and the workers it forks, which share its command line; not the daemons
    of the driver's data source planning; under this process's driver JVM, as the machine is
    shared) started within the last ``since_s`` seconds: the workers a case had to start
    although it was warmed (None: no /proc)."""
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
        me, fresh = os.getpid(), 0
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"pyspark.daemon\0pyspark.worker\0" not in f.read():
                        continue
                parent, start = _stat(pid)
                while parent > 1 and parent != me:  # ours: a descendant of this process
                    parent = _stat(str(parent))[0]
            except (OSError, ValueError, IndexError):
                continue
            fresh += parent == me and uptime - start / ticks < since_s
        return fresh
    except (OSError, ValueError):
        return None


def _task_stats(journal: str, batches: int) -> list[dict[str, int]]:
    """Each task's own counters from its END marker in the journal (``join_ms``: from its
    consumer's creation to its first records; ``polls``, ``journal_slots``, ...), per batch
    (``seq``) and task (``part``). The query's last batch is not committed under AvailableNow,
    so its markers are still there; an earlier, committed batch's are gone."""
    from pyspark_kafka_share.source.journal.journal import Journal

    out: list[dict[str, int]] = []
    opened = Journal(journal, fsync=False)
    for seq in range(1, batches + 2):
        for part, end in sorted(opened.batch_ends(seq).items()):
            out.append({"seq": seq, "part": part, "records": end.records, **end.stats})
    return out


def kind_is_share(progress: Any) -> bool:
    """Whether a progress entry's source is kafka-share (its latestOffset carries metrics)."""
    return bool(progress.sources) and "lastBatch" in (progress.sources[0].latestOffset or "")


def read_stamps(stamps: Path) -> dict[str, Any]:
    """What the per-task stamp files say: the seconds from the first row processed to the
    last, and the rows each task processed (largest first)."""
    lines = [json.loads(f.read_text()) for f in stamps.iterdir()]
    if not lines:
        return {"processed_s": None, "task_rows": []}
    t0 = min(x["first"] for x in lines)
    starts: dict[int, float] = {}  # per Spark task (a worker: each of its chunks writes one)
    for x in lines:
        task = int(x.get("task", -1))
        starts[task] = min(starts.get(task, x["first"]), x["first"])
    ages: dict[int, float] = {}  # per Spark task: its Python worker's age at its first rows
    for x in sorted(lines, key=lambda x: float(x["first"])):
        if x.get("age") is not None:
            ages.setdefault(int(x.get("task", -1)), float(x["age"]))
    return {"processed_s": round(max(x["last"] for x in lines) - t0, 3),
            # when the last task got its first rows, after the first task got its own
            "start_skew_s": round(max(starts.values()) - t0, 2),
            "worker_pids": sorted({int(x["pid"]) for x in lines if "pid" in x}),
            "worker_age_s": sorted(ages.values()),
            "task_rows": sorted((int(x["rows"]) for x in lines), reverse=True),
            # per task: (first rows arrived, last row done) in seconds after the first, rows
            "task_spans": sorted((round(x["first"] - t0, 2), round(x["last"] - t0, 2),
                                  int(x["rows"])) for x in lines)}


class SparkBench:
    """Runs Spark queries over the datasets in one SparkSession."""

    def __init__(self, spark: Any, kafka: LocalKafka, tmp: Path, *, timeout_s: float = 900.0):
        self.spark = spark
        self.kafka = kafka
        self.tmp = tmp
        self.timeout_s = timeout_s

    def _dir(self, kind: str) -> str:
        path = self.tmp / fresh_name(kind)
        return str(path)

    def _share_reader(self, topic: str, *, delivery: str, num_partitions: int | None,
                      extra: dict[str, str] | None = None) -> Any:
        group = fresh_name("bench-ks")
        self.kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
        reader = (self.spark.readStream.format("kafka-share")
                  .option("kafka.bootstrap.servers", self.kafka.bootstrap_servers)
                  .option("kafka.group.id", group)
                  .option("subscribe", topic)
                  .option("delivery", delivery)
                  .option("journalPath", self._dir("journal")))
        if num_partitions is not None:
            reader = reader.option("numPartitions", num_partitions)
        for key, value in (extra or {}).items():
            reader = reader.option(key, value)
        return reader.load()

    def _kafka_reader(self, topic: str) -> Any:
        return (self.spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", self.kafka.bootstrap_servers)
                .option("subscribe", topic)
                .option("startingOffsets", "earliest")
                .load())

    def source(self, kind: str, data: Dataset, *, num_partitions: int | None = None) -> Any:
        if kind == "kafka":
            return self._kafka_reader(data.topic)
        delivery = {"share-eo": "exactly-once", "share-eo-nofsync": "exactly-once",
                    "share-eo-records": "exactly-once", "share-eo-native": "exactly-once",
                    "share-amo": "at-most-once"}[kind]
        # Each case names its client: share-eo-native the native one (the source's default),
        # every other librdkafka, as it was measured before the default changed (issue 39).
        extra = {"client": "native" if kind == "share-eo-native" else "librdkafka",
                 **{"share-eo-nofsync": {"journalFsync": "false"},
                    "share-eo-records": {"journalContent": "records"}}.get(kind, {})}
        return self._share_reader(data.topic, delivery=delivery, num_partitions=num_partitions,
                                  extra=extra)

    def drain(self, df: Any, data: Dataset, *, cost_s: float = 0.0) -> tuple[
            int, float, float, dict[str, Any]]:
        """Run ``df`` → noop sink with Trigger.AvailableNow; verify it read every record once.

        Returns (records, wall seconds from start() to termination, the sum of the batches'
        triggerExecution seconds, extra).
        """
        stamps = Path(self._dir("stamps"))
        if cost_s > 0:
            stamps.mkdir(parents=True)
            df = df.select("offset").mapInArrow(_sleeper(cost_s, str(stamps)), "offset long")
        start = time.monotonic()
        query = (df.writeStream.format("noop")
                 .option("checkpointLocation", self._dir("checkpoint"))
                 .trigger(availableNow=True).start())
        try:
            finished = query.awaitTermination(self.timeout_s)
        except Exception as exc:
            raise BenchError(f"query failed: {exc}") from exc
        wall = time.monotonic() - start
        if not finished:
            query.stop()
            raise BenchError(f"query did not finish within {self.timeout_s:.0f}s")
        progress = list(query.recentProgress)
        rows = sum(int(p.numInputRows) for p in progress)
        steady = sum(int(p.durationMs.get("triggerExecution", 0)) for p in progress) / 1000
        if rows != data.records:
            raise BenchError(f"query read {rows} records, expected {data.records} "
                             f"(batches: {[int(p.numInputRows) for p in progress]})")
        extra: dict[str, Any] = {
            "batches": sum(1 for p in progress if int(p.numInputRows) > 0),
            "batch_rows": [int(p.numInputRows) for p in progress if int(p.numInputRows) > 0],
            # Where each trigger's time went (Spark's phases), for docs/benchmarks.
            "durations_ms": [dict(p.durationMs) for p in progress],
        }
        if cost_s > 0:
            extra.update(read_stamps(stamps))
        # the source's metrics of each finished batch, reported with the next plan
        extra["source_batches"] = [json.loads(p.sources[0].latestOffset or "{}").get("lastBatch")
                                   for p in progress if kind_is_share(p)]
        with_data = [p for p in progress if int(p.numInputRows) > 0]
        if with_data and with_data[-1].sources:
            metrics = with_data[-1].sources[0].metrics
            if metrics:
                extra["last_batch_source_metrics"] = dict(metrics)
        return rows, wall, steady, extra

    # -- queue workers -----------------------------------------------------------------------

    def warm_python_workers(self, n: int) -> dict[str, Any]:
        """Make Spark's pool hold ``n`` Python workers that have imported the package, as a
        cluster that has been running jobs has them: a barrier job of ``n`` tasks (each in a
        Python worker of its own). Spark stops its pooled idle Python workers once none has
        started or returned for a minute (``PythonWorkerFactory``'s idle timeout, 1 min in
        PySpark 4.x), so a case after an 85 s one-task case starts on fresh ones otherwise.
        Returns the workers' pids and ages (seconds)."""
        start = time.monotonic()
        rows = (self.spark.range(0, n, 1, n)
                .mapInArrow(_warmer(), "pid long, age double", barrier=True).collect())
        pids = sorted({int(r.pid) for r in rows})
        if len(pids) != n:
            raise BenchError(f"warming {n} Python workers ran in {len(pids)}: {pids}")
        return {"warm_pids": pids, "warm_age_s": sorted(float(r.age) for r in rows),
                "warm_s": round(time.monotonic() - start, 2)}

    def source_spread(self, data: Dataset, *, tasks: int, cost_s: float) -> tuple[
            int, float, float, dict[str, Any]]:
        """The source with ``client=native`` and ``numPartitions=tasks`` over ``data`` (one
        partition), each record costing ``cost_s`` in a mapInArrow after it (:meth:`drain`).

        On warm Python workers: a source task takes two, the source's reader and the
        mapInArrow's, and the barrier job of :meth:`warm_python_workers` does not warm the
        readers (measured: after a barrier job of 8 tasks of two chained mapInArrows, 16
        Python workers, an 8-task case still started 9; Spark keeps a pool per worker
        environment, and the data source's reads seem to have a pool of their own). So, right
        before the case and untimed, the same query drains a topic of 300 records per task
        (the tasks overlap: each waits for its consumer's join), which leaves ``tasks``
        readers and ``tasks`` mapInArrow workers idle in Spark's pools.
        ``maxBatchDurationMs`` is lifted so that one micro-batch reads the whole topic for one
        task as for eight: the 1-task case is the linear baseline, and batch boundaries (a
        group join each) would only slow it. Spark's Arrow batches into the mapInArrow are
        :data:`SOURCE_SPREAD_ARROW_BATCH` rows (``spark.sql.execution.arrow.maxRecordsPerBatch``,
        10,000 by default: a task's whole share here, so its work would start only once it
        has read all of it, however early the source yields its rows).

        Returns (records, wall seconds, seconds from the first record processed to the last,
        extra: rows and first-row stamps per task, the Python workers the case started)."""
        options = {"client": "native", "maxBatchDurationMs": "600000"}
        conf = "spark.sql.execution.arrow.maxRecordsPerBatch"
        before = self.spark.conf.get(conf)
        self.spark.conf.set(conf, str(SOURCE_SPREAD_ARROW_BATCH))
        try:
            return self._source_spread(data, tasks, cost_s, options)
        finally:
            self.spark.conf.set(conf, before)

    def _source_spread(self, data: Dataset, tasks: int, cost_s: float,
                       options: dict[str, str]) -> tuple[int, float, float, dict[str, Any]]:
        warm, _ = produce_dataset(self.kafka, f"warm-src-n{tasks}", 1, 300 * tasks)
        start = time.monotonic()
        _, _, _, warmed = self.drain(
            self._share_reader(warm.topic, delivery="exactly-once", num_partitions=tasks,
                               extra=options), warm, cost_s=cost_s)
        warm_s = round(time.monotonic() - start, 2)
        journal = self._dir("journal")
        df = self._share_reader(data.topic, delivery="exactly-once", num_partitions=tasks,
                                extra={**options, "journalPath": journal})
        count, wall, _steady, extra = self.drain(df, data, cost_s=cost_s)
        extra["task_stats"] = _task_stats(journal, len(extra["durations_ms"]))
        extra.update({"warm_s": warm_s, "warm_pids": warmed.get("worker_pids"),
                      "warm_age_s": warmed.get("worker_age_s"),
                      "warm_task_rows": warmed.get("task_rows")})
        extra["warm_reused"] = len(set(extra.get("worker_pids") or [])
                                   & set(warmed.get("worker_pids") or []))
        # every Python worker of ours started since the case did: 0 when both pools were warm
        extra["python_workers_started_in_case"] = _fresh_python_workers(wall)
        return count, wall, extra["processed_s"] or wall, extra

    def workers(self, data: Dataset, *, workers: int, cost_s: float,
                client: str = "librdkafka", warm: bool = False) -> tuple[
                    int, float, float, dict[str, Any]]:
        """``run_workers`` with ``workers`` workers (share consumer ``client``) over ``data``,
        each record costing ``cost_s`` (a sleep per Arrow chunk of ``chunk_size`` rows), until
        every record is processed; ``warm``: on warm Python workers
        (:meth:`warm_python_workers`, not timed). Returns (records, wall seconds of
        run_workers, seconds from the first record processed to the last, extra)."""
        from pyspark_kafka_share.workers import run_workers

        warmed = self.warm_python_workers(workers) if warm else {}
        stamps = Path(self._dir("stamps"))
        stamps.mkdir(parents=True)
        chunk = _sleeper(cost_s, str(stamps))

        def work(table: Any) -> None:
            for _ in chunk(iter([table])):
                pass

        group = fresh_name("bench-workers")
        start = time.monotonic()
        summary = run_workers(self.spark, work, topics=data.topic, group=group,
                              bootstrap_servers=self.kafka.bootstrap_servers, workers=workers,
                              batch_format="arrow", max_records=data.records,
                              starting_offsets="earliest", idle_timeout_s=60,
                              on_progress=False, client=client)  # type: ignore[arg-type]
        wall = time.monotonic() - start
        processed = summary.totals["processed"]
        if processed != data.records or summary.totals["accepted"] != data.records:
            raise BenchError(f"workers processed {processed} and accepted "
                             f"{summary.totals['accepted']} of {data.records} records "
                             f"({summary.stop_reason})")
        stamped = read_stamps(stamps)
        extra = {"processed_s": stamped["processed_s"],
                 "worker_rows": sorted((int(w.get("processed", 0)) for w in summary.workers),
                                       reverse=True),
                 "stop_reason": summary.stop_reason,
                 "start_skew_s": stamped.get("start_skew_s"),
                 "worker_age_s": stamped.get("worker_age_s"), **warmed}
        if warmed:  # how many of the case's Python workers were the warmed ones
            extra["warm_reused"] = len(set(stamped.get("worker_pids") or [])
                                       & set(warmed["warm_pids"]))
        return processed, wall, stamped["processed_s"] or wall, extra

    # -- latency ---------------------------------------------------------------------------

    def latency(self, kind: str, *, partitions: int, rate: int, seconds: float,
                warmup_s: float) -> tuple[int, float, dict[str, Any]]:
        """Produce ``rate`` records/s for ``seconds`` into a fresh topic while a query with a
        foreachBatch sink follows it; per row, latency = time in foreachBatch - Kafka timestamp.

        Returns (records, produce seconds, extra with percentiles over the rows produced after
        ``warmup_s``).
        """
        import numpy as np
        from pyspark.sql import functions as F

        topic = self.kafka.create_topic(fresh_name("bench-latency"), partitions)
        if kind == "kafka":
            df = self._kafka_reader(topic)
        else:
            delivery = "at-most-once" if kind == "share-amo" else "exactly-once"
            df = self._share_reader(topic, delivery=delivery, num_partitions=None,
                                    extra={} if kind == "share-eo-defaults"
                                    else LATENCY_SHARE_OPTIONS)
        lock = threading.Lock()
        stamps: list[Any] = []
        lags: list[Any] = []
        seen = [0]

        def on_batch(batch_df: Any, _batch_id: int) -> None:
            table = batch_df.select(F.unix_millis("timestamp").alias("ts")).toArrow()
            now_ms = time.time() * 1000
            ts = table.column("ts").to_numpy().astype("float64")
            with lock:
                stamps.append(ts)
                lags.append(now_ms - ts)
                seen[0] += len(ts)

        # One record per partition before the query starts: every share partition then has
        # state after the first batch, so the source knows the backlog is 0 and idles (on a
        # never-written topic it plans back-to-back empty batches instead).
        primed = self.kafka.produce(topic, [ProducerRecord(value=b"prime", partition=p)
                                            for p in range(partitions)])
        query = (df.writeStream.foreachBatch(on_batch)
                 .option("checkpointLocation", self._dir("checkpoint")).start())
        try:
            idle = self._await_ready(query, seen, primed)
            produced, produce_s, prod_start = _paced_produce(
                self.kafka, topic, rate=rate, seconds=seconds)
            deadline = time.monotonic() + 120
            while seen[0] < produced + primed and time.monotonic() < deadline:
                if query.exception() is not None:
                    raise BenchError(f"latency query failed: {query.exception()}")
                if not query.isActive:
                    raise BenchError("the latency query stopped by itself")
                time.sleep(0.1)
        finally:
            query.stop()
        if seen[0] != produced + primed:
            raise BenchError(f"latency run ({kind}) saw {seen[0]} records, produced "
                             f"{produced} (+{primed} before the start)")
        ts_all = np.concatenate(stamps)
        lag_all = np.concatenate(lags)
        keep = ts_all >= (prod_start + warmup_s) * 1000
        sample = lag_all[keep]
        pct = np.percentile(sample, [50, 90, 99, 100]) if len(sample) else [0, 0, 0, 0]
        cdf = np.percentile(sample, list(range(101))) if len(sample) else []
        extra = {
            "p50_ms": round(float(pct[0]), 1), "p90_ms": round(float(pct[1]), 1),
            "p99_ms": round(float(pct[2]), 1), "max_ms": round(float(pct[3]), 1),
            "measured_records": int(keep.sum()),
            "warmup_p50_ms": round(float(np.percentile(lag_all[~keep], 50)), 1)
            if (~keep).any() else None,
            "cdf_ms": [round(float(v), 1) for v in cdf],
            "idle_before_producing": idle,
            "batches": len(stamps),
        }
        return produced, produce_s, extra

    @staticmethod
    def _await_ready(query: Any, seen: list[int], primed: int, *,
                     timeout_s: float = 90.0, idle_timeout_s: float = 15.0) -> bool:
        """Wait until the query has delivered the priming records, then (for at most
        ``idle_timeout_s``) until it waits for data. Returns whether it went idle."""
        deadline = time.monotonic() + timeout_s
        while seen[0] < primed:
            if query.exception() is not None or not query.isActive:
                raise BenchError(f"latency query failed: {query.exception()}")
            if time.monotonic() > deadline:
                raise BenchError(f"the latency query read {seen[0]} of the {primed} priming "
                                 f"records in {timeout_s:.0f}s")
            time.sleep(0.1)
        deadline = time.monotonic() + idle_timeout_s
        while time.monotonic() < deadline:
            status = query.status
            if status.get("message") == "Waiting for data to arrive" \
                    and not status.get("isTriggerActive"):
                time.sleep(1.0)
                return True
            time.sleep(0.1)
        return False


def _paced_produce(kafka: LocalKafka, topic: str, *, rate: int, seconds: float) -> tuple[
        int, float, float]:
    """Send ``rate`` records/s for ``seconds`` in 10 ms ticks; return (count, seconds, start)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers,
                         **LATENCY_PRODUCER_CONFIG})
    values = _values(int(rate * seconds) + 1)
    tick = 0.01
    start_wall = time.time()
    start = time.monotonic()
    sent = 0
    total = int(rate * seconds)
    while sent < total:
        due = min(total, int((time.monotonic() - start) * rate) + 1)
        while sent < due:
            key, value = next(values)
            producer.produce(topic, value, key)
            sent += 1
        producer.poll(0)
        time.sleep(tick)
    left = producer.flush(60)
    if left:
        raise BenchError(f"{left} latency records were not delivered")
    return sent, time.monotonic() - start, start_wall
