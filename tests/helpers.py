"""Helpers shared by the test tiers (unit, integration, cluster, chaos): ``tests.helpers``.

- :func:`read_topic`: every record of a topic, read with a classic consumer.
- :func:`record_key`, :func:`record_value`: a consumed record's ``(topic, partition, offset)``
  and value.
- :func:`poll_share`: poll a share consumer, acknowledging and committing what it gets.
- The ``kafka-share`` source's tests: :func:`share_reader` / :func:`share_stream` (a reader
  of topics in a group, with a journal), :func:`produce_spread` / :func:`spread_keys` (records
  spread over partitions, and their keys), :func:`start_parquet` / :func:`run_to_end` /
  :func:`run_available_now` (a Parquet file sink query), :func:`sink_keys` and
  :func:`assert_exactly_once` (the sink against what was produced).
- :func:`group_lag`: a share group's total lag, ``None`` while the broker cannot tell.
- :func:`explain_missing`: what happened to records missing from a sink (the workers' counters,
  the share group's offsets and lag, dead letters, delivery counts), for a failure message.
- :func:`read_only_dir`: a directory the current user cannot create files in.
- :func:`wait_for`: poll a value until a condition holds, failing with the last value.
- :func:`fails_within`: a call must raise a given error, matching a pattern, within a time.
- :class:`TierReport`, :func:`tier_hooks`: a tier that runs in a pytest process of its own
  and prints what it saw again in the terminal summary.
- The queue workers' tests: :func:`log_call` / :func:`read_calls` (evidence of each call of a
  worker function, in a file), :func:`worker_dies_once` and :func:`check_killed_worker` (a
  Python worker killed mid-chunk, from a classic or a Connect session),
  :func:`check_lease_keeps_second_attempt_out` (a second attempt of a running worker waits for
  the lease, over either control transport). This module is pickled by value: worker functions
  that call its helpers run in Spark's Python workers, which cannot import ``tests``.

Where a test's journal lives (``JournalAt``, the ``journal`` fixture) is in
:mod:`tests.fixtures.journal`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from confluent_kafka import AcknowledgeType, Consumer, KafkaException, Message, ShareConsumer
from pyspark import cloudpickle

from pyspark_kafka_share._kafka.group import list_offsets
from pyspark_kafka_share._kafka.partition import TopicPartition as KernelTopicPartition
from pyspark_kafka_share.admin import ShareGroupAdmin
from pyspark_kafka_share.errors import KafkaShareError
from pyspark_kafka_share.harness import LocalKafka, ProducerRecord
from tests.fixtures.journal import JournalAt

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamReader

    from pyspark_kafka_share.workers import Record, WorkerJob, WorkerSummary
    from pyspark_kafka_share.workers.control import DriverChannel

__all__ = [
    "CollectionHook",
    "Key",
    "OptionValue",
    "SummaryHook",
    "TierReport",
    "assert_exactly_once",
    "check_killed_worker",
    "check_lease_keeps_second_attempt_out",
    "explain_missing",
    "group_lag",
    "log_call",
    "output_origins",
    "poll_share",
    "produce_spread",
    "read_calls",
    "read_only_dir",
    "read_topic",
    "record_key",
    "record_value",
    "run_available_now",
    "run_to_end",
    "share_reader",
    "share_stream",
    "sink_keys",
    "spread_keys",
    "start_parquet",
    "tier_hooks",
    "wait_for",
    "worker_dies_once",
    "worker_faults",
]

# The queue workers' helpers below run in Spark's Python workers (classic, cluster, Connect),
# which cannot import this module: ship it by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

T = TypeVar("T")
Key = tuple[str, int, int]  # (topic, partition, offset) of a record
OptionValue = str | int | float | bool  # what DataStreamReader.option takes
CollectionHook = Callable[[pytest.Config, list[pytest.Item]], None]
SummaryHook = Callable[[pytest.TerminalReporter], None]


def wait_for(get: Callable[[], T], ok: Callable[[T], bool], timeout_s: float = 30.0,
             what: str = "condition") -> T:
    """Call ``get`` until ``ok(value)``; fail with the last value after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    value = get()
    while not ok(value):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached within {timeout_s}s; last value: {value!r}")
        time.sleep(0.3)
        value = get()
    return value


def fails_within(call: Callable[[], object], error: type[Exception], match: str,
                 seconds: float = 5.0) -> str:
    """Run ``call``; it must raise ``error`` matching ``match`` within ``seconds``; its text."""
    start = time.monotonic()
    with pytest.raises(error, match=match) as info:
        call()
    elapsed = time.monotonic() - start
    assert elapsed < seconds, f"took {elapsed:.1f}s: {info.value}"
    return str(info.value)


@dataclass
class TierReport:
    """What a tier saw (seeds, kills, retries): each line is printed when noted and again, under
    ``title``, in the terminal summary (call :meth:`summary` from the conftest's
    ``pytest_terminal_summary``)."""

    title: str
    lines: list[str] = field(default_factory=list)

    def note(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)

    def summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.lines:
            terminalreporter.section(self.title)
            for line in self.lines:
                terminalreporter.write_line(line)


def tier_hooks(marker: str, reason: str,
               report: TierReport) -> tuple[CollectionHook, SummaryHook]:
    """A tier's two conftest hooks, ``(pytest_collection_modifyitems,
    pytest_terminal_summary)``: the tier's tests (marked ``marker``) are skipped with ``reason``
    when the run, after -m/-k deselection, holds others (the tier needs a pytest process of its
    own), and ``report`` is printed in the terminal summary."""

    @pytest.hookimpl(trylast=True)  # after -m/-k deselection
    def collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
        tier = [i for i in items if i.get_closest_marker(marker) is not None]
        if tier and len(tier) < len(items):
            for item in tier:
                item.add_marker(pytest.mark.skip(reason=reason))

    def terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
        report.summary(terminalreporter)

    return collection_modifyitems, terminal_summary


def record_key(m: Message) -> Key:
    """``(topic, partition, offset)`` of a consumed record (which has all three)."""
    topic, partition, offset = m.topic(), m.partition(), m.offset()
    assert topic is not None and partition is not None and offset is not None, m
    return topic, partition, offset


def record_value(m: Message) -> bytes:
    """The value of a consumed record that has one."""
    value = m.value()
    assert value is not None, m
    return value


def output_origins(msgs: list[Message]) -> list[Key]:
    """The origin of each of the workers' outputs or dead letters: the record it was made from,
    from its ``kafka-share.origin.*`` headers."""
    out = []
    for m in msgs:
        h = {k: v.decode() if isinstance(v, bytes) else str(v)
             for k, v in dict(m.headers() or []).items()}
        out.append((h["kafka-share.origin.topic"], int(h["kafka-share.origin.partition"]),
                    int(h["kafka-share.origin.offset"])))
    return out


def read_topic(kafka: LocalKafka, topic: str, expect: int, timeout_s: float = 30.0,
               settle_s: float = 2.0, isolation: str = "read_committed",
               config: Mapping[str, Any] | None = None) -> list[Message]:
    """Every record of ``topic`` (classic consumer from the start, ``isolation.level``
    ``isolation``): waits until ``expect`` records arrived and then ``settle_s`` without more,
    or ``timeout_s`` in all. ``config``: client settings instead of the broker's address
    (``client_config()`` of a secured listener)."""
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, **(config or {}),
                  "group.id": f"reader-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "isolation.level": isolation})
    c.subscribe([topic])
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    quiet_until = None
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                if len(out) >= expect:
                    quiet_until = quiet_until or time.monotonic() + settle_s
                    if time.monotonic() >= quiet_until:
                        break
                continue
            assert m.error() is None, m.error()
            out.append(m)
    finally:
        c.close()
    return out


def worker_faults(points: str) -> dict[str, Any]:
    """The queue workers' test-only fault points (``_kafka/faults.py``) as a keyword argument
    of ``run_workers`` / ``start_workers`` (not in their typed options)."""
    return {"_fault_injection": points}


def poll_share(consumer: ShareConsumer, ack: AcknowledgeType = AcknowledgeType.ACCEPT, *,
               timeout_s: float | None = None, until: Callable[[list[Message]], bool] | None = None,
               quiet_s: float | None = None, check_commits: bool = False) -> list[Message]:
    """Poll ``consumer``, acknowledging every record with ``ack`` and committing after each poll
    that got some, until ``until(seen)`` holds, ``quiet_s`` passed without a record, or
    ``timeout_s`` passed in all; return what it got. ``check_commits``: fail on a partition
    the commit reports an error for."""
    seen: list[Message] = []
    started = quiet_since = time.monotonic()
    while until is None or not until(seen):
        now = time.monotonic()
        if timeout_s is not None and now - started >= timeout_s:
            break
        if quiet_s is not None and now - quiet_since >= quiet_s:
            break
        batch = consumer.poll(0.5)
        for m in batch:
            assert m.error() is None, m.error()
            consumer.acknowledge(m, ack)
            seen.append(m)
        if len(batch):
            results = consumer.commit_sync()
            assert not check_commits or all(e is None for e in results.values()), results
            quiet_since = time.monotonic()
    return seen


# -- the kafka-share source ----------------------------------------------------------------------


def share_reader(spark: SparkSession, kafka: LocalKafka, topics: str | list[str], group: str,
                 journal: JournalAt | Path | None = None,
                 **options: OptionValue) -> DataStreamReader:
    """A ``kafka-share`` stream reader of ``topics`` in ``group`` (``pollTimeoutMs`` 1500 unless
    ``options`` say otherwise), its journal at ``journal`` (none: at-most-once)."""
    where: dict[str, OptionValue] = {}
    if isinstance(journal, JournalAt):
        where = {**journal.source_options}
    elif journal is not None:
        where = {"journalPath": str(journal)}
    r = (spark.readStream.format("kafka-share")
         .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
         .option("kafka.group.id", group)
         .option("subscribe", topics if isinstance(topics, str) else ",".join(topics)))
    for key, value in {"pollTimeoutMs": 1500, **where, **options}.items():
        r = r.option(key, value)
    return r


def share_stream(spark: SparkSession, kafka: LocalKafka, topics: str | list[str], group: str,
                 journal: JournalAt | Path | None = None, **options: OptionValue) -> DataFrame:
    """:func:`share_reader`, loaded."""
    return share_reader(spark, kafka, topics, group, journal, **options).load()


def produce_spread(kafka: LocalKafka, topic: str, partitions: int, n: int,
                   value: Callable[[int], bytes] = lambda i: b"v%d" % i,
                   key: Callable[[int], bytes | None] = lambda i: None) -> set[Key]:
    """Produce records ``0..n-1`` to ``topic`` (record ``i`` to partition ``i % partitions``,
    none there before); return their keys (offsets are dense per partition)."""
    kafka.produce(topic, (ProducerRecord(value=value(i), key=key(i), partition=i % partitions)
                          for i in range(n)), producer_config={"batch.size": "16384"})
    return spread_keys(topic, partitions, n)


def spread_keys(topic: str, partitions: int, n: int) -> set[Key]:
    """The keys of the records :func:`produce_spread` produces."""
    per = Counter(i % partitions for i in range(n))
    return {(topic, p, o) for p, c in per.items() for o in range(c)}


def start_parquet(df: DataFrame, out: Path, chk: Path, *,
                  available_now: bool = False) -> StreamingQuery:
    """Start a query writing ``df`` to Spark's exactly-once file sink (Parquet) at ``out``."""
    w = (df.writeStream.format("parquet").option("path", str(out))
         .option("checkpointLocation", str(chk)))
    if available_now:
        w = w.trigger(availableNow=True)
    return w.start()


def run_to_end(query: StreamingQuery, timeout_s: int = 240) -> StreamingQuery:
    """Wait for an AvailableNow ``query`` to finish; fail if it did not, or failed."""
    query.awaitTermination(timeout_s)
    assert not query.isActive, "the AvailableNow query did not finish"
    if query.exception() is not None:
        raise AssertionError(f"query failed: {query.exception()}")
    return query


def run_available_now(df: DataFrame, out: Path, chk: Path,
                      timeout_s: int = 240) -> StreamingQuery:
    """Run ``df`` into a Parquet sink at ``out`` with an AvailableNow trigger, to its end."""
    return run_to_end(start_parquet(df, out, chk, available_now=True), timeout_s)


def drain_available_now(spark: SparkSession, df: DataFrame, out: Path, chk: Path,
                        expected: set[Key], timeout_s: int = 240, runs: int = 4) -> None:
    """``run_available_now``, then on PySpark 4.0/4.1 (one micro-batch per AvailableNow run:
    docs/operations.md) again while the sink lacks some of ``expected``, as the docs' recipe
    for those lines does (at most ``runs`` runs). On 4.2+ one run must drain: no repeat."""
    from pyspark_kafka_share._spark import ADMISSION_CONTROL

    run_available_now(df, out, chk, timeout_s)
    for _ in range(runs - 1):
        if ADMISSION_CONTROL or not expected - set(sink_keys(spark, out)):
            return
        run_available_now(df, out, chk, timeout_s)


def sink_keys(spark: SparkSession, out: Path) -> list[Key]:
    """The keys of every row of the Parquet sink at ``out`` (none before its first file)."""
    if not list(out.glob("*.parquet")):
        return []
    rows = spark.read.parquet(str(out)).select("topic", "partition", "offset").collect()
    return [(r.topic, r.partition, r.offset) for r in rows]


def assert_exactly_once(got: list[Key], expected: set[Key]) -> None:
    """``got`` (a sink's keys) holds each of ``expected`` once, and nothing else."""
    dups = [k for k, c in Counter(got).items() if c > 1]
    assert not dups, f"{len(dups)} records in the sink twice, e.g. {dups[:3]}"
    missing = expected - set(got)
    assert not missing, f"{len(missing)} records lost, e.g. {sorted(missing)[:3]}"
    assert set(got) == expected


def group_lag(kafka: LocalKafka, group: str) -> int | None:
    """The share group's total lag (records not yet acknowledged for good); ``None`` while
    the broker cannot tell (no share state yet, a coordinator loading after a restart)."""
    try:
        with ShareGroupAdmin(kafka.bootstrap_servers, timeout_s=20) as admin:
            return known_lag(kafka, {(o.topic, o.partition): o.lag for o in admin.offsets(group)})
    except (KafkaShareError, KafkaException, OSError):
        return None


def known_lag(kafka: LocalKafka, lags: Mapping[tuple[str, int], int | None]) -> int | None:
    """The sum of ``lags`` (each partition's lag as the group reports it, ``None``: unknown);
    ``None`` if there are none or a partition's lag is unknown while its log holds records.

    The broker reports no lag for a partition no record was ever fetched from (Kafka 4.2-4.4):
    with all of a test's records produced within one sticky-partitioner window, the other
    partition reads unknown for ever, although nothing there waits. Such a partition, its log
    empty (ListOffsets earliest = latest), counts 0. Every test's "drained" reads lag here."""
    unknown = [tp for tp, lag in lags.items() if lag is None]
    if not lags or (unknown and log_offsets(kafka, unknown, "earliest")
                    != log_offsets(kafka, unknown, "latest")):
        return None
    return sum(lag for lag in lags.values() if lag is not None)


def log_offsets(kafka: LocalKafka, partitions: list[tuple[str, int]], which: str) -> list[int]:
    """The log start (``which="earliest"``) or end (``"latest"``) offset of each of
    ``partitions``, in their order (ListOffsets, the kernel's :func:`list_offsets`)."""
    from confluent_kafka.admin import OffsetSpec

    tps = [KernelTopicPartition(t, p) for t, p in partitions]
    spec = (OffsetSpec.earliest if which == "earliest"
            else OffsetSpec.latest)()  # type: ignore[no-untyped-call]
    got = list_offsets(kafka.admin(), tps, spec, 20.0)
    return [got[tp] for tp in tps]


def stop_when_drained(job: WorkerJob, kafka: LocalKafka, group: str, timeout_s: float = 300,
                      *, settled: Callable[[], bool] | None = None,
                      retried: Iterable[int | str] = (),
                      lag: Callable[[], int | None] | None = None) -> WorkerSummary:
    """Stop ``job`` once the share group's lag is 0 (every record acknowledged for good:
    accepted, rejected or dead-lettered), with ``settled`` once it holds too and with
    ``retried`` once a later attempt of each of those workers reported (Spark's retry of a
    killed one, which fences its open transaction; see :func:`retried_attempt`); the summary.
    ``lag`` reads the group's total lag (``None``: unknown); by default :func:`group_lag`,
    which connects without credentials: a secured listener's test passes a read as its user.

    What a test means by "the workers are done". Idle timeouts of a few seconds stood for it and
    ended jobs with records left on a loaded machine (a task's start, a retried task, a lock's
    expiry outlast them). ``timeout_s`` only bounds a failure (a job that never drains): the
    workers are stopped either way and the test fails with the last lag and the summary."""
    read_lag = lag if lag is not None else (lambda: group_lag(kafka, group))
    drained = False
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if read_lag() == 0 and (settled is None or settled()) \
                    and all(retried_attempt(job, w) for w in retried):
                drained = True
                break
            time.sleep(0.5)
    finally:
        summary = job.stop("the test is done", grace_s=120)
    assert summary is not None
    assert drained, (f"group {group} not drained within {timeout_s}s (lag "
                     f"{read_lag()}):\n{summary}")
    return summary


def retried_attempt(job: WorkerJob, worker: int | str) -> bool:
    """A later attempt of ``worker`` (Spark's retry of the killed one) has reported.
    ``worker`` is its index, or the file :func:`worker_dies_once` writes it to once killed."""
    if isinstance(worker, str):
        if not Path(worker).exists() or not Path(worker).read_text():
            return False
        worker = int(Path(worker).read_text())
    return int(job.progress().workers.get(worker, {}).get("attempt", 0)) >= 1


def explain_missing(kafka: LocalKafka, group: str, summary: WorkerSummary | None,
                    missing: Iterable[Key], dead_letters: Iterable[Key] = (),
                    deliveries: Mapping[Key, list[int]] | None = None) -> str:
    """Why ``missing`` records are not in a sink, for a failure message: the workers' summary
    and per-worker counters, the share group's start offset and lag per partition (a missing
    record below the start offset, or on a partition with lag 0, was settled for good: lost;
    at or past it with lag left, it may still be unacknowledged), whether it was dead-lettered,
    and the delivery counts the worker function saw for it (``deliveries``)."""
    keys = sorted(missing)
    lines = [f"{len(keys)} missing: {keys[:12]}{' ...' if len(keys) > 12 else ''}"]
    if summary is not None:
        lines += [str(summary), *(f"  worker {w.get('worker')}: {w}" for w in summary.workers)]
    try:
        with ShareGroupAdmin(kafka.bootstrap_servers, timeout_s=20) as admin:
            offsets = {(o.topic, o.partition): o for o in admin.offsets(group)}
    except (KafkaShareError, OSError) as exc:  # say why there are none; keep the failure
        lines.append(f"share group {group!r} offsets unavailable: {exc!r}")
        offsets = {}
    dead = set(dead_letters)
    for tp, o in sorted(offsets.items()):
        on_tp = [k for k in keys if k[:2] == tp]
        below = sum(1 for k in on_tp if o.start_offset is not None and k[2] < o.start_offset)
        lines.append(f"  {tp[0]}-{tp[1]}: start_offset={o.start_offset} lag={o.lag}; "
                     f"missing here={len(on_tp)}, below the start offset (settled)={below}")
    for k in keys[:12]:
        seen = (deliveries or {}).get(k)
        lines.append(f"  {k}: dead-lettered={k in dead} delivery counts the function saw="
                     f"{seen if seen is not None else 'never called'}")
    return "\n".join(lines)


# -- a directory nobody here may write to --------------------------------------------------------


@contextlib.contextmanager
def read_only_dir(path: Path) -> Iterator[str]:
    """Create ``path`` so that this user cannot create files in it; yield the cause the probe
    must name. Not root: ``chmod 555`` (permission denied). Root, whom file modes do not stop:
    a read-only tmpfs mounted there (read-only file system), if this process may mount;
    otherwise the test is skipped."""
    path.mkdir(parents=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield "permission denied"
        finally:
            path.chmod(0o755)
        return
    mount = shutil.which("mount")
    done = mount is not None and subprocess.run(
        [mount, "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)],
        capture_output=True, check=False).returncode == 0
    if not done:
        pytest.skip("running as root (file modes do not stop it) and cannot mount a "
                    "read-only tmpfs")
    try:
        yield "read-only file system"
    finally:
        subprocess.run(["umount", str(path)], capture_output=True, check=False)


DRIVER_LOG_SENTINEL = "tests: capturing the driver log"


@contextlib.contextmanager
def driver_log(spark: SparkSession) -> Iterator[Callable[[], str]]:
    """Spark's driver log (log4j, root logger at INFO: plans, task failures with the executors'
    Python tracebacks) for the duration, as text; it starts with :data:`DRIVER_LOG_SENTINEL`."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    core = jvm.org.apache.logging.log4j.core
    ctx = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    config = ctx.getConfiguration()
    writer = jvm.java.io.StringWriter()
    name = f"driver-log-{uuid.uuid4().hex[:8]}"
    layout = core.layout.PatternLayout.newBuilder().withPattern("%d %p %c: %m%n") \
        .withConfiguration(config).build()
    appender = core.appender.WriterAppender.createAppender(layout, None, writer, name, False,
                                                           True)
    appender.start()
    config.addAppender(appender)
    root = config.getRootLogger()
    root.addAppender(appender, None, None)
    spark.sparkContext.setLogLevel("INFO")
    jvm.org.apache.logging.log4j.LogManager.getLogger(name).info(DRIVER_LOG_SENTINEL)
    try:
        yield lambda: str(writer.toString())
    finally:
        spark.sparkContext.setLogLevel("WARN")
        root.removeAppender(name)
        ctx.updateLoggers()
        appender.stop()


# -- the queue workers: evidence of each call, a killed Python worker, the lease ----------------


def read_calls(path: Path) -> list[dict[str, Any]]:
    """The calls :func:`log_call` wrote to ``path``, in order (none yet: empty)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def log_call(path: str, rec: Record, **extra: Any) -> None:
    """Append one call of a worker function to ``path`` (run in the Python worker): the record's
    value and delivery count, the worker (task partition; -1 outside a task) and ``extra``."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    line = json.dumps({"value": (rec.value or b"").decode(), "dc": rec.delivery_count,
                       "worker": ctx.partitionId() if ctx else -1, **extra})
    with open(path, "a") as f:
        f.write(line + "\n")


def worker_dies_once(log: str, killed: str, after: int = 30) -> Callable[[Record], bytes]:
    """A worker function echoing each value, logging each call to ``log``: the first worker to
    make its ``after``-th call in a first task attempt writes its index to ``killed`` and its
    Python worker dies (``os._exit``) mid-chunk, with no RELEASE and no ACCEPT; once."""

    def work(rec: Record) -> bytes:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        me = ctx.partitionId()
        log_call(log, rec, attempt=ctx.attemptNumber())
        mine = sum(1 for c in read_calls(Path(log)) if c["worker"] == me)
        if ctx.attemptNumber() == 0 and mine >= after:
            try:  # the first worker to get here dies, once
                fd = os.open(killed, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass
            else:
                os.write(fd, str(me).encode())
                os.close(fd)
                os._exit(137)  # the Python worker dies mid-chunk: no RELEASE, no ACCEPT
        time.sleep(0.01)
        return rec.value or b""

    return work


def assert_killed_attempt_lost(summary: WorkerSummary, victim: int) -> None:
    """The killed attempt (``victim``'s first) is shown as lost. Not the exact list: on a loaded
    machine Spark may lose a further attempt (a Python worker or task timing out). Not that
    Spark retried it either: the other workers of the share group can drain the queue (the dead
    attempt's records come back when their locks expire) before Spark's retry starts; tests
    that need the retry wait for it (``stop_when_drained(retried=...)``). What was lost or
    duplicated is each test's own check."""
    lost = {(w["worker"], w["attempt"]) for w in summary.failed_attempts}
    assert (victim, 0) in lost, f"the killed attempt is not shown as lost:\n{summary}"


def check_killed_worker(kafka: LocalKafka, summary: WorkerSummary, out: str, n: int,
                        log: str, killed: str) -> Counter[str]:
    """After :func:`worker_dies_once` ran over ``n`` records (values ``"0"``..) with
    ``output_topic=out``: Spark retried the killed worker's task, the summary shows the killed
    attempt as lost, every record reached ``out`` (nothing lost) and the dead worker's records
    came back (delivered again). Returns how often each value was output."""
    victim = int(Path(killed).read_text())
    # The victim's final report comes from Spark's retry (the retry may get no records: the
    # survivor can take all of the dead worker's records once they come back).
    final = {w["worker"]: w for w in summary.workers}
    assert final[victim]["attempt"] >= 1, "Spark did not retry the killed worker's task"
    assert_killed_attempt_lost(summary, victim)
    outputs = Counter((m.value() or b"").decode() for m in read_topic(kafka, out, n))
    assert set(outputs) == {str(i) for i in range(n)}  # nothing lost
    assert any(c["dc"] > 1 for c in read_calls(Path(log))), "no record came back"
    return outputs


def check_lease_keeps_second_attempt_out(kafka: LocalKafka, topic: str, group: str,
                                         monkeypatch: pytest.MonkeyPatch,
                                         server: DriverChannel) -> None:
    """Two attempts of worker 0 in threads against a real broker and ``server`` (the driver's
    side of either control transport), as Spark's speculation would run them: the copy, started
    once the holder reported its 50 records, opens no consumer while the holder runs and ends
    without one (``duplicate``, never polled). Closes ``server``."""
    from pyspark_kafka_share.admin import ShareGroupAdmin
    from pyspark_kafka_share.workers import loop
    from pyspark_kafka_share.workers.config import WorkerConfig, WorkerSpec

    kafka.produce(topic, [b"%d" % i for i in range(50)])
    ident = threading.local()
    monkeypatch.setattr(loop, "attempt_identity", lambda: (0, 0, ident.attempt))
    config = WorkerConfig.create(topics=topic, group=group, time_budget_s=12,
                                 bootstrap_servers=kafka.bootstrap_servers)
    spec = WorkerSpec(config, lock_ms=30_000, delivery_limit=5, control=server.endpoint,
                      report_interval_s=0.2)
    results: dict[int, dict[str, Any]] = {}

    def attempt(n: int) -> None:
        ident.attempt = n
        results[n] = loop.run_worker(spec, lambda r: None)

    holder = threading.Thread(target=attempt, args=(0,))
    holder.start()
    try:
        with ShareGroupAdmin(kafka.bootstrap_servers, timeout_s=10) as admin:
            wait_for(lambda: server.latest().get(0, {}).get("processed", 0), lambda p: p == 50,
                     30, "the first attempt's report")
            copy = threading.Thread(target=attempt, args=(1,))
            copy.start()
            time.sleep(3)
            members = admin.describe(group).members
            assert len(members) == 1, f"a second consumer joined: {members}"
            copy.join(30)
            holder.join(30)
    finally:
        holder.join(30)
        server.close()
    assert results[0]["state"] == "stopped" and results[0]["processed"] == 50
    assert results[1]["state"] == "duplicate", results[1]
    assert "received" not in results[1]  # it never polled
