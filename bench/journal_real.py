"""The journal's requests in a real run: a paced stream, a streaming query, every request to
the local S3 server counted from its log; beside it Spark's ``kafka`` source at the same rate.

    python bench/journal_real.py [--rates 1000,10000] [--tasks 8,32] [--seconds 60]
                                 [--warmup-s 60] [--trigger-s 10] [--partitions 4]
                                 [--no-kafka] [--max-poll-records N]
                                 [--client librdkafka|native]
                                 [--out docs/benchmarks/journal_real.json]

For each rate x tasks: a fresh topic of ``--partitions`` partitions, a producer paced at the
rate (records of 200 bytes), and a query with a ``noop`` sink and a processing-time trigger of
``--trigger-s``:

- ``kafka-share``, exactly-once, default options but ``numPartitions`` = tasks, its journal on
  ``s3://`` (the local S3 server, moto: :class:`~pyspark_kafka_share.harness.LocalS3`) and its
  Spark checkpoint on the same server through ``s3a://``;
- Spark's ``kafka`` source (``startingOffsets=latest``), its checkpoint on the same server
  through ``s3a://`` (hadoop-aws of pyspark's Hadoop version and the AWS SDK bundle, fetched
  once into the jar cache: ``bench/_jars.py``).

After ``--warmup-s`` (the query's start, the first batches' backlog) the server's log is
counted for ``--seconds``: requests by kind and by prefix (the journal, the checkpoint),
micro-batches and rows from the query's progress, and for kafka-share the records per journal
slot (``records`` / ``journal_slots`` of the batches' metrics) and the polls per slot
(``slot_polls`` / ``journal_slots``: 1 with librdkafka; with ``--client native`` a slot may
hold several fetches, up to the group's ``share.partition.max.record.locks``). Printed:
requests/s, per micro-batch, per task and micro-batch, per 1,000 records, records per slot
and $/day at S3's list prices (``journal_capacity.cost_per_day``). ``make bench-journal`` runs it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _jars
from _contenders import LATENCY_PRODUCER_CONFIG, VALUE_BYTES, BenchError
from _machine import describe
from journal_capacity import S3_PRICE_READ, S3_PRICE_WRITE, LogTail, request_key

from pyspark_kafka_share.harness import LocalKafka, LocalS3, local_spark

BUCKET = "real-journal"
MASTER = "local[8]"
REQUEST_KINDS = ("create", "put", "get", "head", "list", "delete", "post")


@dataclass
class Counted:
    """Requests to the bench's bucket by kind and by (kind, what: journal or checkpoint)."""

    kinds: Counter[str] = field(default_factory=Counter)
    where: Counter[str] = field(default_factory=Counter)
    groups: Counter[str] = field(default_factory=Counter)  # "<kind> <key group>"

    def cost_per_day(self, seconds: float) -> float:
        """Dollars per day at S3's list prices (PUT, COPY, POST, LIST: writes; GET, HEAD:
        reads; DELETE free)."""
        writes = sum(self.kinds[k] for k in ("create", "put", "list", "post"))
        reads = self.kinds["get"] + self.kinds["head"]
        return 86_400 / seconds * (writes * S3_PRICE_WRITE + reads * S3_PRICE_READ) / 1000


def _kind(method: str, target: str) -> tuple[str, str] | None:
    """(kind, key) of one request to :data:`BUCKET`; None for anything else."""
    parsed = request_key(target, BUCKET)
    if parsed is None:
        return None
    key, query = parsed
    if method == "GET" and ("list-type" in query or not key):
        return "list", query.get("prefix", [""])[0]
    if method == "POST":
        return "post", key
    if method == "PUT":
        return "put", key  # create vs overwrite: told apart below by the key
    kind = {"GET": "get", "HEAD": "head", "DELETE": "delete"}.get(method)
    return (kind, key) if kind else None


def _group(key: str, journal_root: str) -> str:
    """Which part of the journal (or of the checkpoint) ``key`` is."""
    if not key.startswith(journal_root):
        parts = key.split("/")
        return "checkpoint/" + (parts[2] if len(parts) > 2 else "")
    parts = key[len(journal_root):].strip("/").split("/")
    if parts[0] == "batches":
        return "journal/batches/<seq>/<part>/<slot>" if len(parts) >= 4 and parts[3] \
            else "journal/batches/"
    if parts[0] == "index":
        return "journal/index/<topic>/<partition>/"
    return f"journal/{parts[0]}"


class ServerLog(LogTail):
    """The requests the S3 server logged since the last :meth:`take` (read as it stands: the
    real run counts a window, not a settled step)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, settle=False)

    def take(self, journal_root: str) -> Counted:
        counted = Counted()
        for m in self.lines():
            found = _kind(m.group(1), m.group(2))
            if found is None:
                continue
            kind, key = found
            if kind == "put" and key.startswith(journal_root) and \
                    not key.endswith("/committed"):
                kind = "create"  # the journal's conditional creates (the fence is overwritten)
            counted.kinds[kind] += 1
            where = "bulk delete" if not key else \
                "journal" if key.startswith(journal_root) else "checkpoint"
            counted.where[where] += 1
            counted.groups[f"{kind} {_group(key, journal_root) if key else '(bucket)'}"] += 1
        return counted


@dataclass
class Result:
    source: str
    rate: int
    tasks: int
    partitions: int
    trigger_s: float
    seconds: float
    batches: int
    rows: int
    requests: int
    by_kind: dict[str, int]
    by_where: dict[str, int]
    by_group: dict[str, int]
    requests_per_s: float
    per_batch: float
    per_task_batch: float | None
    per_1000_records: float
    journal_slots: int | None
    records_per_slot: float | None
    dollars_per_day: float
    journal_dollars_per_day: float | None
    max_poll_records: int = 0  # kafka-share's kafka.max.poll.records (0: the default 2000)
    journal_requests_per_s: float | None = None
    journal_per_batch: float | None = None
    client: str = "librdkafka"  # kafka-share's client option
    polls_per_slot: float | None = None


def _pace(kafka: LocalKafka, topic: str, rate: int, stop: threading.Event,
          sent: list[int]) -> None:
    """Produce ``rate`` records/s of :data:`VALUE_BYTES` until ``stop`` (10 ms ticks)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers,
                         **LATENCY_PRODUCER_CONFIG})
    value = b"v" * VALUE_BYTES
    start = time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - start) * rate)
        while sent[0] < due:
            producer.produce(topic, value, f"k{sent[0] % 100_000:05d}".encode())
            sent[0] += 1
            if sent[0] % 10_000 == 0:
                producer.poll(0)
        producer.poll(0)
        time.sleep(0.01)
    producer.flush(60)


def _batches_in(query: Any, since_ms: float, until_ms: float) -> list[Any]:
    """Progress entries of the micro-batches that started in ``[since_ms, until_ms)``, with
    rows (a trigger without data counts as no micro-batch)."""
    from datetime import datetime

    found = []
    for p in query.recentProgress:
        at = datetime.fromisoformat(p.timestamp.replace("Z", "+00:00")).timestamp() * 1000
        if since_ms <= at < until_ms and p.numInputRows > 0:
            found.append(p)
    return found


class RealRun:
    """One SparkSession, one broker, one S3 server for every case of the run."""

    def __init__(self, spark: Any, kafka: LocalKafka, s3: LocalS3, args: argparse.Namespace):
        self.spark, self.kafka, self.s3, self.args = spark, kafka, s3, args
        assert s3.log_path is not None
        self.log = ServerLog(s3.log_path)

    def case(self, source: str, rate: int, tasks: int) -> Result:
        args = self.args
        name = f"{source}-{rate}-{tasks}-{uuid.uuid4().hex[:6]}"
        topic = self.kafka.create_topic(name, args.partitions)
        journal_root = f"{name}/journal"
        df = self._share(topic, name, tasks, journal_root) if source == "kafka-share" \
            else self._kafka(topic)
        stop, sent = threading.Event(), [0]
        producer = threading.Thread(target=_pace, args=(self.kafka, topic, rate, stop, sent),
                                    daemon=True)
        producer.start()
        query = (df.writeStream.format("noop")
                 .option("checkpointLocation", f"s3a://{BUCKET}/{name}/checkpoint")
                 .trigger(processingTime=f"{args.trigger_s:g} seconds").start())
        try:
            self._wait(query, args.warmup_s)
            self.log.take(journal_root)
            since = time.time() * 1000
            self._wait(query, args.seconds)
            counted = self.log.take(journal_root)
            until = time.time() * 1000
            batches = _batches_in(query, since, until)
        finally:
            query.stop()
            stop.set()
            producer.join(120)
        return self._result(source, rate, tasks, counted, batches=batches,
                            seconds=(until - since) / 1000)

    @staticmethod
    def _wait(query: Any, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if query.exception() is not None:
                raise BenchError(f"the query failed: {query.exception()}")
            time.sleep(0.5)

    def _share(self, topic: str, name: str, tasks: int, journal_root: str) -> Any:
        group = f"bench-real-{name}"
        self.kafka.set_group_config(group, "share.auto.offset.reset", "latest")
        locks = self.args.max_poll_records
        if locks:  # the group's in-flight records per partition must allow such polls
            self.kafka.set_group_config(group, "share.partition.max.record.locks", str(locks))
        reader = (self.spark.readStream.format("kafka-share")
                  .option("kafka.bootstrap.servers", self.kafka.bootstrap_servers)
                  .option("kafka.group.id", group).option("subscribe", topic)
                  .option("numPartitions", tasks).option("client", self.args.client)
                  .option("journalPath", f"s3://{BUCKET}/{journal_root}"))
        if locks:
            reader = reader.option("kafka.max.poll.records", locks)
        for key, value in self.s3.journal_options().items():
            reader = reader.option(key, value)
        return reader.load()

    def _kafka(self, topic: str) -> Any:
        return (self.spark.readStream.format("kafka")
                .option("kafka.bootstrap.servers", self.kafka.bootstrap_servers)
                .option("subscribe", topic).option("startingOffsets", "latest").load())

    def _result(self, source: str, rate: int, tasks: int, counted: Counted, *,
                batches: list[Any], seconds: float) -> Result:
        rows = sum(int(p.numInputRows) for p in batches)
        metrics = [json.loads(p.sources[0].latestOffset or "{}").get("lastBatch") or {}
                   for p in batches] if source == "kafka-share" else []
        slots = sum(int(m.get("journal_slots", 0)) for m in metrics) if metrics else None
        slot_rows = sum(int(m.get("records", 0)) for m in metrics) if metrics else 0
        slot_polls = sum(int(m.get("slot_polls", 0)) for m in metrics) if metrics else 0
        total = sum(counted.kinds.values())
        n = max(1, len(batches))
        journal_cost = None  # the journal's requests (its bulk deletes are POSTs too)
        if source == "kafka-share":
            kinds = Counter({g.split(" ", 1)[0]: 0 for g in counted.groups})
            for group, count in counted.groups.items():
                if " journal/" in group:
                    kinds[group.split(" ", 1)[0]] += count
            journal_cost = Counted(kinds).cost_per_day(seconds)
        return Result(
            source=source, rate=rate,
            tasks=tasks if source == "kafka-share" else self.args.partitions,
            partitions=self.args.partitions,
            trigger_s=self.args.trigger_s, seconds=round(seconds, 1), batches=len(batches),
            rows=rows, requests=total, by_kind=dict(counted.kinds),
            by_where=dict(counted.where), by_group=dict(counted.groups.most_common()),
            requests_per_s=round(total / seconds, 2),
            per_batch=round(total / n, 1),
            per_task_batch=round(counted.where["journal"] / n / tasks, 2)
            if source == "kafka-share" else None,
            per_1000_records=round(1000 * total / max(1, rows), 2),
            journal_slots=slots,
            records_per_slot=round(slot_rows / slots, 1) if slots else None,
            polls_per_slot=round(slot_polls / slots, 2) if slots else None,
            client=self.args.client if source == "kafka-share" else "",
            max_poll_records=self.args.max_poll_records if source == "kafka-share" else 0,
            journal_requests_per_s=round(counted.where["journal"] / seconds, 2)
            if source == "kafka-share" else None,
            journal_per_batch=round(counted.where["journal"] / n, 1)
            if source == "kafka-share" else None,
            dollars_per_day=round(counted.cost_per_day(seconds), 2),
            journal_dollars_per_day=round(journal_cost, 2) if journal_cost is not None
            else None)


def s3a_conf(s3: LocalS3) -> dict[str, str]:
    """Spark settings for ``s3a://`` on the local S3 server."""
    return {
        "spark.hadoop.fs.s3a.endpoint": s3.endpoint_url,
        "spark.hadoop.fs.s3a.endpoint.region": s3.region,
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.access.key": "testing",
        "spark.hadoop.fs.s3a.secret.key": "testing",
        "spark.hadoop.fs.s3a.aws.credentials.provider":
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
    }


def _or(value: float | None, spec: str) -> str:
    return "" if value is None else f"{value:{spec}}"


def _paren(value: float | None, spec: str) -> str:
    return "" if value is None else f" ({value:{spec}})"


def table(results: list[Result]) -> str:
    """Markdown: all requests (the journal's in parentheses), per micro-batch, the journal's
    per task and micro-batch, per 1,000 rows, records per slot, $/day at S3's list prices."""
    lines = ["| source | rate (rec/s) | tasks | micro-batches | rows | requests/s (journal) | "
             "per micro-batch (journal) | journal per task and batch | per 1,000 rows | "
             "records per slot (polls per slot) | $/day (journal) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        poll = f", max.poll.records {r.max_poll_records}" if r.max_poll_records else ""
        poll += ", client=native" if r.client == "native" else ""
        lines.append(
            f"| {r.source}{poll} | {r.rate:,} | {r.tasks} | {r.batches} | {r.rows:,} | "
            f"{r.requests_per_s:.2f}{_paren(r.journal_requests_per_s, '.2f')} | "
            f"{r.per_batch:.1f}{_paren(r.journal_per_batch, '.1f')} | "
            f"{_or(r.per_task_batch, '.2f')} | {r.per_1000_records:.2f} | "
            f"{_or(r.records_per_slot, ',.0f')}{_paren(r.polls_per_slot, '.2f')} | "
            f"{r.dollars_per_day:.2f}"
            f"{_paren(r.journal_dollars_per_day, '.2f')} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1000,10000", help="records/s, comma-separated")
    ap.add_argument("--tasks", default="8,32", help="numPartitions, comma-separated")
    ap.add_argument("--seconds", type=float, default=60.0, help="counted, per case")
    ap.add_argument("--warmup-s", type=float, default=60.0, help="not counted, per case (the "
                    "query's start and first batch: over 70 s at a load average of 38)")
    ap.add_argument("--trigger-s", type=float, default=10.0)
    ap.add_argument("--partitions", type=int, default=4, help="topic partitions")
    ap.add_argument("--no-kafka", action="store_true", help="skip Spark's kafka source")
    ap.add_argument("--max-poll-records", type=int, default=0,
                    help="kafka-share: kafka.max.poll.records and the group's "
                    "share.partition.max.record.locks (Kafka 4.3+); 0: the defaults (2000)")
    ap.add_argument("--client", choices=("librdkafka", "native"), default="librdkafka",
                    help="kafka-share's share consumer (option client)")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args()
    rates = [int(x) for x in args.rates.split(",")]
    tasks = [int(x) for x in args.tasks.split(",")]
    jars = _jars.ensure_s3a_jars() + ([] if args.no_kafka else _jars.ensure_spark_kafka_jars())
    results: list[Result] = []
    # The broker caps a group's share.partition.max.record.locks at
    # group.share.max.partition.max.record.locks (4,000 by default on 4.3).
    locks = {"group.share.max.partition.max.record.locks": str(args.max_poll_records)} \
        if args.max_poll_records > 4000 else {}
    with LocalS3() as s3, LocalKafka(extra_config=locks) as kafka, \
            tempfile.TemporaryDirectory():
        s3.create_bucket(BUCKET)
        spark = local_spark(MASTER, "pyspark-kafka-share-journal-real", log_level="ERROR",
                            conf={"spark.jars": ",".join(map(str, jars)),
                                  "spark.driver.memory": "3g", **s3a_conf(s3)})
        try:
            run = RealRun(spark, kafka, s3, args)
            for rate in rates:
                for t in tasks:
                    sources = ["kafka-share"] + ([] if args.no_kafka or t != tasks[0]
                                                 else ["kafka"])
                    for source in sources:
                        result = run.case(source, rate, t)
                        print(json.dumps(asdict(result)), flush=True)
                        results.append(result)
        finally:
            spark.stop()
    print(table(results))
    if args.out:
        about = describe(Path(__file__).resolve().parents[1], _jars.connector_version())
        args.out.write_text(json.dumps({**about, "args": {
            k: str(v) for k, v in vars(args).items()}, "results": [asdict(r) for r in results]},
            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
