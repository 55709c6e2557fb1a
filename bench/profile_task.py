"""Where one kafka-share task's time goes: the executor-side reader, no Spark, exactly-once
against at-most-once.

    python bench/profile_task.py [--records N] [--modes amo,eo,eo-nofsync,eo-records]
                                 [--rounds R] [--profile MODE]

Produces N records (200-byte values) to a 1-partition topic on an embedded broker, then runs
``read_partition`` in this process, exactly as a Spark task would (pooled share consumer,
journal in a temp dir), once per mode and round, each with its own share group, modes
alternating within a round. Modes: ``amo`` (at-most-once), ``eo`` (exactly-once, default
options), ``eo-nofsync`` (``journalFsync=false``), ``eo-records`` (``journalContent=records``),
each with ``client=librdkafka`` (named: the source's default is the native client);
``amo-native`` and ``eo-native``: ``amo`` and ``eo`` with ``client=native``.

Timing counters wrap the steps a task takes (the functions named in the table; inclusive
times, so the fence reads are also inside the lookup and open) and print, per mode, the
medians over the rounds: wall time, this process's CPU time (every thread's, librdkafka's
too; the broker's not), then seconds per step and per poll. ``--profile MODE[,MODE]``
also runs those modes once each under cProfile and prints the functions that took the time
(``--sort tottime``: by self time).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import os
import pstats
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _contenders import produce_dataset

from pyspark_kafka_share._kafka import pool as _pool
from pyspark_kafka_share._kafka.native import adapter as native_adapter
from pyspark_kafka_share._kafka.native import consumer as native_consumer
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.protocol.client import BrokerConnection
from pyspark_kafka_share._kafka.share import ShareSession
from pyspark_kafka_share.harness import LocalKafka
from pyspark_kafka_share.source import task as task_mod
from pyspark_kafka_share.source.journal.fencing import PartLog
from pyspark_kafka_share.source.journal.journal import Journal
from pyspark_kafka_share.source.journal.keys import SlotKeys
from pyspark_kafka_share.source.journal.stores.local import LocalStore
from pyspark_kafka_share.source.options import parse_options
from pyspark_kafka_share.source.poller import Poller
from pyspark_kafka_share.source.task import TaskSpec, read_partition

MODES: dict[str, dict[str, str]] = {
    "amo": {"delivery": "at-most-once", "client": "librdkafka"},
    "eo": {"delivery": "exactly-once", "client": "librdkafka"},
    "eo-nofsync": {"delivery": "exactly-once", "journalFsync": "false", "client": "librdkafka"},
    "eo-records": {"delivery": "exactly-once", "journalContent": "records",
                   "client": "librdkafka"},
    "amo-native": {"delivery": "at-most-once", "client": "native"},
    "eo-native": {"delivery": "exactly-once", "client": "native"},
}

# (label, owner, attribute): the steps timed, in the order of a poll.
STEPS: list[tuple[str, Any, str]] = [
    ("poll (Poller.next_poll)", Poller, "next_poll"),
    ("  librdkafka poll (ShareSession)", ShareSession, "poll"),
    ("  native ShareFetch (_fetch_from)", native_consumer.NativeShareConsumer, "_fetch_from"),
    ("    decode to Arrow (acquired_batch)", native_consumer, "acquired_batch"),
    ("  native ArrowPoll (one batch)", native_adapter.ArrowPoll, "__init__"),
    ("native round trips (conn.send)", BrokerConnection, "send"),
    ("to Arrow (messages_to_batch)", task_mod, "messages_to_batch"),
    ("keys (SlotKeys.of_table)", SlotKeys, "of_table"),
    ("dedup lookup (find_journaled)", Journal, "find_journaled"),
    ("  list open slots (files_under)", LocalStore, "files_under"),
    ("publish (PartLog.append)", PartLog, "append"),
    ("  exclusive create", LocalStore, "create_exclusive"),
    ("  fsync (file + directory)", os, "fsync"),
    ("fence reads (committed_seq)", Journal, "committed_seq"),
    ("ACCEPT + commit_sync (settle)", ShareSession, "settle"),
    ("ACCEPT + commit_sync (native)", native_adapter.NativeSession, "settle"),
    ("open the log (PartLog.open)", PartLog, "open"),
    ("END (PartLog.end)", PartLog, "end"),
]

CPU = "CPU (this process, every thread)"


@contextmanager
def timed(steps: list[tuple[str, Any, str]]) -> Iterator[dict[str, list[float]]]:
    """Wrap each step; yields label -> [seconds, calls], filled while the block runs."""
    totals: dict[str, list[float]] = {label: [0.0, 0.0] for label, _, _ in steps}
    saved: list[tuple[Any, str, Any]] = []

    def wrap(label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timer(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[label][0] += time.perf_counter() - start
                totals[label][1] += 1
        return timer

    for label, owner, attr in steps:
        raw = owner.__dict__[attr]
        saved.append((owner, attr, raw))
        fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        wrapped: Any = wrap(label, fn)
        if isinstance(raw, classmethod):
            wrapped = classmethod(wrapped)
        elif isinstance(raw, staticmethod):
            wrapped = staticmethod(wrapped)
        setattr(owner, attr, wrapped)
    try:
        yield totals
    finally:
        for owner, attr, raw in saved:
            setattr(owner, attr, raw)


def _group(kafka: LocalKafka) -> str:
    group = f"prof-{uuid.uuid4().hex[:8]}"
    kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
    return group


def _spec(kafka: LocalKafka, topic: str, records: int, mode: str) -> TaskSpec:
    opts = parse_options({
        "kafka.bootstrap.servers": kafka.bootstrap_servers, "kafka.group.id": _group(kafka),
        "subscribe": topic, "journalPath": tempfile.mkdtemp(prefix="prof-journal-"),
        "maxBatchDurationMs": "600000", **MODES[mode]})
    # The budget as a Spark task without maxRecordsPerTrigger has it: its share of the
    # backlog (with task_max_records the native client would poll strictly throughout).
    return TaskSpec(opts, seq=0, part=0, parts=1, task_max_records=None,
                    backlog_share=records, lock_ms=30_000,
                    partitions=(TopicPartition(topic, 0),))


def run_once(spec: TaskSpec) -> tuple[float, int, dict[str, list[float]]]:
    """(seconds, rows, step totals) of one task."""
    with timed(STEPS) as totals:
        start, cpu = time.perf_counter(), time.process_time()
        rows = sum(b.num_rows for b in read_partition(spec))
        took = time.perf_counter() - start
        totals[CPU] = [time.process_time() - cpu, 1.0]  # every thread's: librdkafka's too
    _pool.close_all()
    return took, rows, totals


def _report(results: dict[str, list[tuple[float, int, dict[str, list[float]]]]]) -> None:
    modes = list(results)
    print(f"{'median over rounds':34}" + "".join(f"{m:>22}" for m in modes))
    walls = {m: statistics.median(r[0] for r in results[m]) for m in modes}
    rows = {m: results[m][0][1] for m in modes}
    print(f"{'wall s (rows/s)':34}" + "".join(
        f"{walls[m]:>9.2f} ({rows[m] / walls[m]:>9,.0f})" for m in modes))
    polls = {m: statistics.median(r[2]["publish (PartLog.append)"][1] or
                                  r[2]["ACCEPT + commit_sync (settle)"][1] or
                                  r[2]["ACCEPT + commit_sync (native)"][1] for r in results[m])
             for m in modes}
    cpu = {m: statistics.median(r[2][CPU][0] for r in results[m]) for m in modes}
    print(f"{'CPU s (us per record)':34}" + "".join(
        f"{cpu[m]:>9.2f} ({cpu[m] / rows[m] * 1e6:>9.2f})" for m in modes))
    print(f"{'polls with records':34}" + "".join(f"{polls[m]:>22.0f}" for m in modes))
    for label, _, _ in STEPS:
        cells = []
        for m in modes:
            s = statistics.median(r[2][label][0] for r in results[m])
            per = s / polls[m] * 1e3 if polls[m] else 0.0
            cells.append(f"{s:>8.3f} s {per:>6.2f} ms" if s else f"{'-':>22}")
        print(f"{label:34}" + "".join(f"{c:>22}" for c in cells))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=300_000)
    ap.add_argument("--modes", default="amo,eo,eo-nofsync")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", default="",
                    help="also run these modes (comma-separated) under cProfile")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--sort", default="cumulative",
                    help="the profile's order: cumulative, or tottime (self time)")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        ap.error(f"--modes: unknown {sorted(unknown)}; choose from {sorted(MODES)}")
    with LocalKafka() as kafka:
        topic = produce_dataset(kafka, "prof", 1, args.records)[0].topic
        # Warm the broker's share coordinator (its first group pays a one-off few seconds).
        warm = parse_options({"kafka.bootstrap.servers": kafka.bootstrap_servers,
                              "kafka.group.id": _group(kafka), "subscribe": topic,
                              "delivery": "at-most-once", "maxRecordsPerTrigger": "1"})
        list(read_partition(TaskSpec(warm, 0, 0, 1, task_max_records=1, lock_ms=30_000)))
        _pool.close_all()
        results: dict[str, list[tuple[float, int, dict[str, list[float]]]]] = {
            m: [] for m in modes}
        for n in range(args.rounds):
            for mode in modes if n % 2 == 0 else reversed(modes):
                results[mode].append(run_once(_spec(kafka, topic, args.records, mode)))
                took, rows, _ = results[mode][-1]
                print(f"round {n + 1} {mode}: {rows} rows in {took:.2f} s", flush=True)
        print(f"\n{args.records:,} records of 200 B, one task, one consumer (its group join "
              "included), journal on the local filesystem; inclusive times\n")
        _report(results)
        if args.profile:
            for mode in args.profile.split(","):
                _profile(_spec(kafka, topic, args.records, mode), mode, args.top, args.sort)
    return 0


def _profile(spec: TaskSpec, mode: str, top: int, sort: str) -> None:
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    rows = sum(b.num_rows for b in read_partition(spec))
    profiler.disable()
    took = time.perf_counter() - start
    _pool.close_all()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats(sort).print_stats(top)
    print(f"\n{mode} under cProfile: {rows} rows in {took:.2f} s = {rows / took:,.0f} rows/s "
          "(the profile adds overhead)")
    print(out.getvalue())


if __name__ == "__main__":
    sys.exit(main())
