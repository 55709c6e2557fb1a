"""The journal's request rate on an object store: a simulation against the local S3 server.

    python bench/journal_capacity.py [--tasks 200] [--polls-per-s 1] [--batch-s 2]
                                     [--batches 2] [--workers 200] [--records 2]
                                     [--partitions 16]
    python bench/journal_capacity.py --formula   # the formula's table (docs/design.md)

N simulated tasks drive the journal's own code paths (``Journal``, ``PartLog``: the calls
``source/task.py`` and the driver make, in the same order) on ``s3://`` against
:class:`~pyspark_kafka_share.harness.s3.LocalS3` (moto), with no Kafka and no Spark:

- task start: ``spec.journal()`` (``check_marker``), ``claim``, ``PartLog.open``;
- each poll: ``find_journaled`` (the duplicate lookup), ``PartLog.append`` (the index entry,
  then the slot), the fence re-read unless ``PartLog.fence_holds`` (an attempt younger than
  half of ``journalRetentionMs``, :data:`RETENTION_MS` here); a poll's records are of one
  topic-partition, the polls
  spread over ``--partitions`` partitions round robin (a share group hands each partition's
  records to every consumer);
- task end: ``PartLog.end``;
- per batch on the driver (one ``Journal`` object for the run, as the source's reader):
  ``batch_ends`` (the batch's metrics), then ``commit``.

Time is scaled down: the tasks poll in lockstep rounds, one poll each per round, and a round
stands for ``1 / polls-per-s`` seconds, so the request *counts* are those of the real rate and
the wall time does not matter. ``--workers`` is the number of Python worker processes the tasks
are spread over (round robin): the journal's key cache is per process, so each simulated
worker gets its own (the module's globals are swapped in around its calls); since the index
(issue 36) no request depends on it.

Every HTTP request is counted from the server's request log, by kind (exclusive create, fence
overwrite, GET, LIST page, bulk DELETE) and by key group, and the rates are set beside the
formula of docs/design.md ("Capacity: requests per second against the stores' limits"),
:func:`predict`, with the requests per slot and per task and micro-batch and the cost per
day at S3's list prices (:func:`cost_per_day`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))

from journal_slot import _batch

from pyspark_kafka_share.harness.s3 import LocalS3
from pyspark_kafka_share.source.journal import journal as journal_mod
from pyspark_kafka_share.source.journal.journal import EndMarker, Journal, ScanResult
from pyspark_kafka_share.source.journal.keys import SlotKeys

BUCKET = "capacity-journal"
LIST_PAGE = 1000  # keys per LIST response (S3, GCS and Azure alike)
RETENTION_MS = 600_000  # journalRetentionMs's default: the sweep runs every half of it

# The published limits (sources in docs/design.md): requests per second.
S3_WRITES_PER_PREFIX = 3_500  # PUT/COPY/POST/DELETE per partitioned prefix
S3_READS_PER_PREFIX = 5_500   # GET/HEAD per partitioned prefix
GCS_WRITES_INITIAL = 1_000    # per bucket, before autoscaling
GCS_READS_INITIAL = 5_000     # per bucket (listing included), before autoscaling
AZURE_PER_BLOB = 500          # target for one blob
AZURE_PER_ACCOUNT = 20_000    # default per account (40,000 in the larger regions)

# S3 Standard list prices (us-east-1), dollars per 1,000 requests. DELETE is free.
S3_PRICE_WRITE = 0.005   # PUT, COPY, POST (the bulk DELETE is a POST), LIST
S3_PRICE_READ = 0.0004   # GET and all other requests

KINDS = ("create", "overwrite", "get", "list", "delete")

# One request line of werkzeug's log, its colour codes included.
_LINE = re.compile(r'"(?:\x1b\[[0-9;]*m)*([A-Z]+) (\S+) HTTP/[0-9.]+(?:\x1b\[0m)?" (\d{3})')


# -- counting the server's requests ---------------------------------------------------------


@dataclass
class Tally:
    """Requests by kind, by (kind, key group), and answers other than 2xx."""

    kinds: Counter[str] = field(default_factory=Counter)
    groups: Counter[tuple[str, str]] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)

    def add(self, other: Tally) -> None:
        self.kinds.update(other.kinds)
        self.groups.update(other.groups)
        self.refused.update(other.refused)


def _group(key: str) -> str:
    """The key group of a journal key (its prefix as the journal lays it out)."""
    parts = key.split("/")[1:]  # below the journal's root
    if not parts or not parts[0]:
        return "(root)"
    if parts[0] == "batches":
        return "batches/<seq>/<part>/<slot>" if len(parts) >= 4 and parts[3] else "batches/"
    if parts[0] == "committed":
        return "committed (the fence: one key)"
    if parts[0] == "index":
        return "index/<topic>/<partition>/" if len(parts) >= 3 else "index/"
    return f"{parts[0]}/" if len(parts) > 1 else parts[0]


def request_key(target: str, bucket: str) -> tuple[str, dict[str, list[str]]] | None:
    """(key, query) of one logged request target to ``bucket``; None for another bucket."""
    url = urlsplit(target)
    found, _, key = unquote(url.path).lstrip("/").partition("/")
    if found != bucket:
        return None
    return key, parse_qs(url.query, keep_blank_values=True)


def classify(method: str, target: str) -> tuple[str, str] | None:
    """(kind, key group) of one request of the journal's bucket; None for anything else."""
    parsed = request_key(target, BUCKET)
    if parsed is None:
        return None
    key, query = parsed
    if method == "GET" and "list-type" in query:
        return "list", _group(query.get("prefix", [""])[0])
    if method == "POST" and "delete" in query:
        return "delete", "(bulk, up to 1,000 keys)"
    if not key:
        return None
    kind = {"GET": "get", "HEAD": "get", "DELETE": "delete"}.get(method)
    if method == "PUT":
        kind = "overwrite" if key.endswith("/committed") else "create"
    return (kind, _group(key)) if kind else None


class LogTail:
    """The request lines a server log gained since the last :meth:`lines` (the S3 server's
    access log: LocalS3's; the real run's in journal_real.py too)."""

    def __init__(self, path: Path, *, settle: bool = True) -> None:
        self.path, self.settle = path, settle
        self.offset = path.stat().st_size

    def _settled_size(self) -> int:
        """The log's size once it stopped growing (the server logs after it answers)."""
        size = -1
        while (now := self.path.stat().st_size) != size:
            size = now
            if not self.settle:
                break
            time.sleep(0.15)
        return size

    def lines(self) -> Iterator[re.Match[str]]:
        """The request lines (``_LINE``: method, path, status) logged since the last call."""
        end = self._settled_size()
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            text = f.read(end - self.offset).decode(errors="replace")
        self.offset = end
        return _LINE.finditer(text)


class RequestLog(LogTail):
    """The requests LocalS3 logged since the last :meth:`take`."""

    def take(self) -> Tally:
        tally = Tally()
        for m in self.lines():
            found = classify(m.group(1), m.group(2))
            if found is None:
                continue
            tally.kinds[found[0]] += 1
            tally.groups[found] += 1
            if not m.group(3).startswith("2"):
                tally.refused[f"{found[0]} {m.group(3)}"] += 1
        return tally


# -- one Python worker process per simulated worker --------------------------------------------


@dataclass
class Worker:
    """The per-process state of the journal module (key cache, markers seen)."""

    key_cache: OrderedDict[str, Any] = field(default_factory=OrderedDict)
    cache_fence: dict[str, int] = field(default_factory=dict)
    claimed: dict[str, str] = field(default_factory=dict)
    markers: set[tuple[str, str]] = field(default_factory=set)
    # The host's notes of passed checks (journal.host_checked): one host per worker, as on a
    # cluster where W = T.
    host_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="capacity-")))


_STATE = {"_KEY_CACHE": "key_cache", "_KEY_CACHE_FENCE": "cache_fence",
          "_CLAIMED": "claimed", "_MARKERS_SEEN": "markers", "_HOST_DIR": "host_dir"}


@contextlib.contextmanager
def as_worker(worker: Worker) -> Iterator[None]:
    """Run the journal's code with ``worker``'s per-process state."""
    saved = {name: getattr(journal_mod, name) for name in _STATE}
    for name, attr in _STATE.items():
        setattr(journal_mod, name, getattr(worker, attr))
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(journal_mod, name, value)


# -- the simulation -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    tasks: int
    polls_per_s: float
    batch_s: float
    batches: int
    workers: int
    records: int
    partitions: int = 1

    @property
    def polls_per_batch(self) -> int:
        """Polls of one task in one batch."""
        return max(1, round(self.polls_per_s * self.batch_s))

    @property
    def seconds(self) -> float:
        """Simulated time of the run's batches."""
        return self.batches * self.polls_per_batch / self.polls_per_s


class Simulation:
    """``load.tasks`` tasks of one query, batch after batch, on one ``s3://`` journal."""

    def __init__(self, s3: LocalS3, load: Load) -> None:
        self.load = load
        opts = {k.removeprefix("journal."): v for k, v in s3.journal_options().items()}
        self.uri = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"
        self.opts = opts
        self.workers = [Worker() for _ in range(load.workers)]
        self.driver = Worker()
        self.log = RequestLog(s3.log_path or Path("/nonexistent"))
        self.phases: dict[str, Tally] = {p: Tally() for p in ("start", "poll", "end", "driver")}
        self.offsets = [0] * load.partitions  # the next offset of each partition
        self.polls = 0
        self.query = uuid.uuid4().hex

    def journal(self) -> Journal:
        return Journal(self.uri, options=self.opts, retention_ms=RETENTION_MS)

    def run(self) -> Tally:
        """Run every batch; return the one-off requests of the query's start."""
        with as_worker(self.driver):
            driver = self.driver_journal = self.journal()
            driver.claim(self.query)
            self.marker = driver.place_marker()
            # A running query's fence promises the retention; only a new journal's first
            # batch runs without one (its tasks re-read the fence per slot). The steady
            # state is what is simulated: batch 0 is committed empty first, as a one-off.
            driver.commit(0, dedup_retention_ms=3_600_000, start_offsets={}, parts=0)
        once = self.log.take()
        for seq in range(1, self.load.batches + 1):
            self._batch(seq)
        return once

    def _on(self, task: int) -> Worker:
        return self.workers[task % len(self.workers)]

    def _batch(self, seq: int) -> None:
        load = self.load
        logs = []
        for task in range(load.tasks):
            with as_worker(self._on(task)):
                j = self.journal()
                j.check_marker(self.marker)
                j.claim(self.query)
                log = j.part_log(seq, task)
                log.open()
                logs.append(log)
        self.phases["start"].add(self.log.take())
        for _ in range(load.polls_per_batch):
            for task, log in enumerate(logs):
                with as_worker(self._on(task)):
                    self._poll(log, seq, task)
        self.phases["poll"].add(self.log.take())
        for task, log in enumerate(logs):
            with as_worker(self._on(task)):
                log.end(functools.partial(_marker, task))
        self.phases["end"].add(self.log.take())
        with as_worker(self.driver):
            driver = self.driver_journal
            driver.batch_ends(seq)
            driver.commit(seq, dedup_retention_ms=3_600_000, start_offsets={},
                          parts=load.tasks)
        self.phases["driver"].add(self.log.take())

    def _poll(self, log: Any, seq: int, task: int) -> None:
        """What ``_Fill._step`` asks of the journal for one poll of fresh records."""
        partition = self.polls % self.load.partitions
        self.polls += 1
        batch = _batch(self.load.records, 10, self.offsets[partition])
        batch = batch.set_column(batch.schema.get_field_index("partition"), "partition",
                                 pa.array([partition] * batch.num_rows, pa.int32()))
        self.offsets[partition] += self.load.records
        keys = SlotKeys.of_table(batch)
        if log.journal.find_journaled(keys):
            raise AssertionError("fresh offsets found in the journal")
        log.append(batch, attempt=task, keys=keys)
        if not log.fence_holds() and log.journal.committed_seq() >= seq:
            raise AssertionError("the fence passed a running batch")


def _marker(attempt: int, scan: ScanResult) -> EndMarker:
    """An END marker that says every data slot was acknowledged (no dedup entries)."""
    return EndMarker(attempt=attempt, data_slots=len(scan.data_slots), records=0,
                     acked_slots=tuple(scan.data_slots))


# -- the formula ------------------------------------------------------------------------------


def _pages(keys: float) -> int:
    return max(1, math.ceil(keys / LIST_PAGE))


def predict(load: Load) -> dict[str, float]:
    """Requests per second by kind (docs/design.md, "Capacity"), steady state: every poll
    brings records of one topic-partition, every slot is acknowledged (no dedup entries),
    batches follow back to back. T tasks, p polls/s per task, T * p * B slots in a batch of
    B seconds. No term depends on the worker processes W: a lookup lists its
    topic-partition's index entries from its lowest offset (one page: the entries above a
    poll's fresh offsets are those of concurrent polls) and reads a slot only on overlap."""
    t, batch_s = load.tasks, load.batch_s
    slots = t * load.polls_per_s * batch_s  # data slots per batch
    # The sweep, every half retention: one recursive listing of batches/ (the batches
    # retained: 1 to 1.5 retentions' worth) and of index/, and their bulk deletes; a share
    # of it per batch.
    sweep_share = batch_s * 1000 / (RETENTION_MS / 2)
    retained = 1.5 * RETENTION_MS / 1000 / batch_s * (slots + t)  # slots and ENDs
    expired = RETENTION_MS / 2 / 1000 / batch_s * (slots + t)
    entries = RETENTION_MS / 2 / 1000 / batch_s * slots  # index entries since the last sweep
    per_batch = {
        # per slot: its index entry and the slot; END per task
        "create": 2 * slots + t,
        "overwrite": 1.0,  # the fence, once per commit
        # start: the fence and one ranged GET of slot 0, which misses (an empty log: no
        # listing); per slot: none (a young attempt: no fence re-read); END: none (created
        # at the slot the task knows to be next); driver: batch_ends reads each log's last
        # slot, its END, in one ranged GET (commit reuses it); commit reads the fence.
        "get": 2 * t + t + 1,
        # per poll: LIST the topic-partition's index entries; driver: batch_ends lists the
        # batch recursively; commit lists nothing (it follows the fence); the sweep's share.
        "list": slots + _pages(slots + t)
        + sweep_share * (_pages(retained) + _pages(entries)),
        # bulk deletes, 1,000 keys each, at the sweep: the batches' slots and ENDs, their
        # index entries
        "delete": sweep_share * (math.ceil(expired / LIST_PAGE)
                                 + math.ceil(entries / LIST_PAGE)),
    }
    return {k: v / batch_s for k, v in per_batch.items()}


def per_slot_and_task(load: Load) -> tuple[float, float]:
    """Requests per slot (one poll with records) and per task and micro-batch (start: the
    fence and one read of slot 0; END: one create; the driver's read of END; and its share of
    the commit's), from :func:`predict`."""
    rates = predict(load)
    total = sum(rates.values())
    polls = load.tasks * load.polls_per_s
    per_slot = 3.0  # two creates and the lookup's listing (no fence re-check: a young attempt)
    per_task = (total - per_slot * polls) * load.batch_s / load.tasks
    return per_slot, per_task


def cost_per_day(rates: dict[str, float]) -> float:
    """Dollars per day at S3's list prices for requests per second by kind."""
    writes = rates["create"] + rates["overwrite"] + rates["list"] + rates["delete"]
    return 86_400 * (writes * S3_PRICE_WRITE + rates["get"] * S3_PRICE_READ) / 1000


# (name, tasks, polls per second per task): issue 36's loads and targets, W = T, B = 10 s.
# Where the load is given in records/s, polls = records/s / records per slot.
FORMULA_LOADS = [
    ("8 tasks x 1 poll/s", 8, 1.0),
    ("32 tasks, 100,000 rec/s, 2,000 per slot", 32, 100_000 / 2_000 / 32),
    ("32 tasks, 100,000 rec/s, 5,000 per slot", 32, 100_000 / 5_000 / 32),
    ("32 tasks, 100,000 rec/s, 10,000 per slot", 32, 100_000 / 10_000 / 32),
    ("40 tasks x 5 polls/s", 40, 5.0),
    ("64 tasks x 2 polls/s", 64, 2.0),
    ("200 tasks x 1 poll/s", 200, 1.0),
    ("200 tasks, 1,000,000 rec/s, 2,000 per slot", 200, 1_000_000 / 2_000 / 200),
    ("200 tasks, 1,000,000 rec/s, 5,000 per slot", 200, 1_000_000 / 5_000 / 200),
    ("1,000 tasks x 1 poll/s", 1000, 1.0),
    ("1,000 tasks x 5 polls/s", 1000, 5.0),
    ("8 tasks, 1,000 rec/s, 100 per slot", 8, 1_000 / 100 / 8),
    ("8 tasks, 1,000 rec/s, 750 per slot (the real run before issue 36 item 2)", 8,
     1_000 / 750 / 8),
    ("8 tasks, 1,000 rec/s, 1,200 per slot (the real run after it)", 8, 1_000 / 1_200 / 8),
    ("8 tasks, 10,000 rec/s, 2,000 per slot (the real run at 10,000/s)", 8,
     10_000 / 2_000 / 8),
]


def formula_table() -> None:
    """The formula at :data:`FORMULA_LOADS` (W = T, B = 10 s), as docs/design.md shows it."""
    print("| load | creates/s | GETs/s (the fence) | LISTs/s | all/s | per slot | "
          "per task and batch | $/day (S3) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, t, p in FORMULA_LOADS:
        load = Load(t, p, 10.0, 1, t, 0)
        r = predict(load)
        slot, task = per_slot_and_task(load)
        fence = (t + 1) / load.batch_s  # per task's start, the commit
        print(f"| {name} | {r['create']:,.1f} | {r['get']:,.1f} ({fence:,.1f}) "
              f"| {r['list']:,.1f} | {sum(r.values()):,.1f} | {slot:.0f} | {task:.1f} | "
              f"{cost_per_day(r):,.2f} |")


# -- the report -------------------------------------------------------------------------------


def report(load: Load, sim: Simulation, once: Tally, took: float) -> None:
    seconds = load.seconds
    total = Tally()
    for tally in sim.phases.values():
        total.add(tally)
    polls = load.tasks * load.polls_per_batch * load.batches
    print(f"{load.tasks} tasks x {load.polls_per_s:g} polls/s, batches of {load.batch_s:g} s "
          f"({load.polls_per_batch} polls per task), {load.batches} batches, {load.workers} "
          f"worker process(es): {polls:,} polls = {seconds:g} simulated s, run in {took:.0f} s "
          f"wall against moto")
    print(f"query start (once): {dict(once.kinds)}")
    print("\nrequests per operation (measured)")
    per = {"start": load.tasks * load.batches, "poll": polls, "end": load.tasks * load.batches,
           "driver": load.batches}
    for phase, tally in sim.phases.items():
        shown = ", ".join(f"{k} {tally.kinds[k] / per[phase]:.2f}" for k in KINDS
                          if tally.kinds[k])
        print(f"  per {'batch (driver)' if phase == 'driver' else 'task ' + phase:16} {shown}")
    print("\nrequests per second: measured / formula")
    expected = predict(load)
    for kind in KINDS:
        measured = total.kinds[kind] / seconds
        print(f"  {kind:10} {measured:12,.0f} / {expected[kind]:12,.0f}")
    measured_rates = {k: total.kinds[k] / seconds for k in KINDS}
    per_poll = sum(sim.phases["poll"].kinds.values()) / polls
    per_task = sum(sum(sim.phases[p].kinds.values()) for p in ("start", "end", "driver")) \
        / (load.tasks * load.batches)
    slot, task = per_slot_and_task(load)
    print(f"\nper slot {per_poll:.2f} requests (formula {slot:.0f}), per task and micro-batch "
          f"{per_task:.2f} (formula {task:.2f}); {load.records} records per slot")
    print(f"cost at S3 list prices: ${cost_per_day(measured_rates):,.2f}/day measured, "
          f"${cost_per_day(expected):,.2f}/day formula")
    print("\nrequests per second by key group (S3 prefix)")
    for (kind, group), count in sorted(total.groups.items(), key=lambda kv: -kv[1]):
        print(f"  {kind:10} {group:36} {count / seconds:12,.0f}")
    if total.refused:
        print(f"\nanswers other than 2xx: {dict(total.refused)}")
    _limits(total, seconds)


def _limits(total: Tally, seconds: float) -> None:
    """The rates against the stores' published limits, as if every key shared one prefix
    (a new journal's prefix, before S3 partitions it)."""
    writes = (total.kinds["create"] + total.kinds["overwrite"] + total.kinds["delete"]) / seconds
    reads = (total.kinds["get"] + total.kinds["list"]) / seconds
    fence = sum(c for (k, g), c in total.groups.items() if g.startswith("committed")) / seconds
    print("\nagainst the published limits (whole journal under one prefix)")
    print(f"  writes {writes:10,.0f}/s: S3 {S3_WRITES_PER_PREFIX:,}/prefix "
          f"{_x(writes, S3_WRITES_PER_PREFIX)}, GCS initial {GCS_WRITES_INITIAL:,}/bucket "
          f"{_x(writes, GCS_WRITES_INITIAL)}")
    print(f"  reads  {reads:10,.0f}/s: S3 {S3_READS_PER_PREFIX:,}/prefix "
          f"{_x(reads, S3_READS_PER_PREFIX)}, GCS initial {GCS_READS_INITIAL:,}/bucket "
          f"{_x(reads, GCS_READS_INITIAL)}")
    print(f"  all    {writes + reads:10,.0f}/s: Azure {AZURE_PER_ACCOUNT:,}/account "
          f"{_x(writes + reads, AZURE_PER_ACCOUNT)}")
    print(f"  the fence (one key) {fence:,.0f}/s: S3 {S3_READS_PER_PREFIX:,} "
          f"{_x(fence, S3_READS_PER_PREFIX)}, Azure {AZURE_PER_BLOB}/blob "
          f"{_x(fence, AZURE_PER_BLOB)}")


def _x(rate: float, limit: int) -> str:
    return f"({rate / limit:.2f}x: {'OVER' if rate > limit else 'under'})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--polls-per-s", type=float, default=1.0, help="per task")
    ap.add_argument("--batch-s", type=float, default=2.0, help="simulated seconds per batch")
    ap.add_argument("--batches", type=int, default=2)
    ap.add_argument("--workers", type=int, default=0, help="Python worker processes (0: one "
                    "per task, as on a cluster)")
    ap.add_argument("--records", type=int, default=2, help="records per poll")
    ap.add_argument("--partitions", type=int, default=16, help="topic partitions")
    ap.add_argument("--formula", action="store_true", help="print the formula's table only")
    args = ap.parse_args()
    if args.formula:
        formula_table()
        return 0
    load = Load(args.tasks, args.polls_per_s, args.batch_s, args.batches,
                min(args.workers or args.tasks, args.tasks), args.records, args.partitions)
    with LocalS3() as s3:
        s3.create_bucket(BUCKET)
        sim = Simulation(s3, load)
        start = time.perf_counter()
        try:
            once = sim.run()
        finally:
            for worker in [*sim.workers, sim.driver]:
                shutil.rmtree(worker.host_dir, ignore_errors=True)
        report(load, sim, once, time.perf_counter() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
