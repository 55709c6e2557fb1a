"""Where a latency run's time goes: the micro-batches of ``bench/run.py``'s latency case, phase
by phase, from Spark's progress events.

    python bench/latency_split.py [--kinds share-eo-defaults,kafka] [--rounds 1]
                                  [--rate 3000] [--seconds 25]

Runs the latency case (a paced producer, a ``foreachBatch`` sink; ``SparkBench.latency``)
for each kind and round, with a listener collecting every progress event, and prints per kind:
the row latency percentiles, the number of batches, and per batch the medians and p90 of
Spark's ``durationMs`` phases (``triggerExecution`` = the whole batch; ``latestOffset`` =
planning in the source; ``addBatch`` = the tasks and the sink; ``walCommit`` and
``commitOffsets`` = the checkpoint's two writes) plus the gap between two batches' starts.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _contenders as c  # noqa: E402
import _jars  # noqa: E402
from run import make_spark  # noqa: E402

from pyspark_kafka_share.harness import LocalKafka  # noqa: E402

PHASES = ("triggerExecution", "latestOffset", "queryPlanning", "getBatch", "addBatch",
          "walCommit", "commitOffsets")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _listener(spark: Any, events: list[dict[str, Any]]) -> None:
    from pyspark.sql.streaming.listener import StreamingQueryListener

    lock = threading.Lock()

    class Collect(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            with lock:
                events.append({"id": str(p.id), "batch": p.batchId, "rows": p.numInputRows,
                               "timestamp": p.timestamp, "durations": dict(p.durationMs)})

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    spark.streams.addListener(Collect())


def _report(kind: str, runs: list[tuple[dict[str, Any], list[dict[str, Any]]]]) -> None:
    from datetime import datetime

    batches = [e for _, evs in runs for e in evs if e["rows"] > 0]
    print(f"\n{kind}: " + "; ".join(
        f"p50 {x['p50_ms']:.0f} ms, p99 {x['p99_ms']:.0f} ms, {x['batches']} batches"
        for x, _ in runs))
    print(f"  batches with rows: {len(batches)}; ms per batch, median / p90:")
    for phase in PHASES:
        vals = [float(e["durations"].get(phase, 0)) for e in batches]
        print(f"    {phase:18} {statistics.median(vals) if vals else 0:>7.0f} / "
              f"{_pct(vals, 0.9):>7.0f}")
    gaps: list[float] = []
    for _, evs in runs:
        starts = sorted(datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00"))
                        .timestamp() for e in evs if e["rows"] > 0)
        gaps += [(b - a) * 1000 for a, b in itertools.pairwise(starts)]
    if gaps:
        print(f"    {'start to start':18} {statistics.median(gaps):>7.0f} / "
              f"{_pct(gaps, 0.9):>7.0f}")
    rows = [e["rows"] for e in batches]
    if rows:
        print(f"    {'rows per batch':18} {statistics.median(rows):>7.0f} / "
              f"{_pct(rows, 0.9):>7.0f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="share-eo-defaults,kafka")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--rate", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=25.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    args = ap.parse_args()
    kinds = [k for k in args.kinds.split(",") if k]
    events: list[dict[str, Any]] = []
    results: dict[str, list[tuple[dict[str, Any], list[dict[str, Any]]]]] = {k: [] for k in kinds}
    tmp = Path(tempfile.mkdtemp(prefix="latency-split-"))
    with LocalKafka(heap="2g") as kafka:
        spark = make_spark(_jars.ensure_spark_kafka_jars(None))
        try:
            _listener(spark, events)
            bench = c.SparkBench(spark, kafka, tmp)
            for rnd in range(args.rounds):
                for kind in kinds if rnd % 2 == 0 else reversed(kinds):
                    before = {e["id"] for e in events}
                    _, _, extra = bench.latency(kind, partitions=4, rate=args.rate,
                                                seconds=args.seconds, warmup_s=args.warmup)
                    new = [e for e in events if e["id"] not in before]
                    results[kind].append((extra, new))
                    print(f"round {rnd + 1} {kind}: p50 {extra['p50_ms']} ms, p99 "
                          f"{extra['p99_ms']} ms, {extra['batches']} batches", flush=True)
        finally:
            spark.stop()
    for kind in kinds:
        _report(kind, results[kind])
    return 0


if __name__ == "__main__":
    sys.exit(main())
