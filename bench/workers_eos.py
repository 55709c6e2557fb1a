"""What exactly-once outputs cost the queue workers: the same work with and without
``exactly_once_outputs``, side by side in one run, on one broker and one Spark.

Throughput: a backlog of ``--records`` records (2 partitions) drained by 2 workers that turn
each record into an output record; records per second from the first function call to the
last. Latency: records produced at ``--rate`` per second for ``--seconds``; the time from a
record's production to its output being readable by a ``read_committed`` consumer (p50, p99).
Each mode runs at each ``--chunk-sizes``; exactly-once runs with ``--transaction-interval-s``
(the knob that trades latency for throughput: how long one transaction keeps taking a poll's
chunks; default: the workers' default, 0.1 s; 0 is one transaction per chunk). Results go to
stdout and, with ``--out``, to a JSON file.

First, ``--rounds`` rounds of the latency at ``--rate`` (300 records/s: issue 40's target, p50
<= 60 ms and p99 <= 250 ms exactly-once in every round) with the default options, at-least-once
and exactly-once side by side (and ``--compare`` variants of exactly-once), each with the
workers' per-phase timings (``workers/phases.py``): the sum, the sum per transaction and the
longest of each phase, and when the slowest 1% were produced (a cluster is one stall).

    .venv/bin/python bench/workers_eos.py [--records 20000] [--chunk-sizes 100,500]
        [--transaction-interval-s 0.1] [--rounds 3] [--latency-only] [--compare 'l={...}']
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer

from pyspark_kafka_share.harness import LocalKafka, local_spark
from pyspark_kafka_share.workers import run_workers
from pyspark_kafka_share.workers.config import WorkerConfig
from pyspark_kafka_share.workers.phases import PHASES


def _stamp_calls(stamps: str) -> Any:
    """A batch function: each row's value is its output; the call's time goes to a file."""

    def work(table: Any) -> list[bytes]:
        with open(os.path.join(stamps, f"{os.getpid()}.txt"), "a") as f:
            f.write(f"{time.time()} {table.num_rows}\n")
        return [v or b"" for v in table.column("value").to_pylist()]

    return work


def _span_s(stamps: str) -> float:
    times = [float(line.split()[0]) for p in Path(stamps).iterdir()
             for line in p.read_text().splitlines()]
    return max(times) - min(times) if len(times) > 1 else 0.0


def _fresh(kafka: LocalKafka, what: str, partitions: int) -> str:
    return kafka.create_topic(f"bench-eos-{what}-{uuid.uuid4().hex[:8]}", partitions)


def _eos_options(eos: bool, interval: float | None) -> dict[str, Any]:
    options: dict[str, Any] = {"exactly_once_outputs": eos}
    if eos and interval is not None:
        options["transaction_interval_s"] = interval
    return options


def throughput(spark: Any, kafka: LocalKafka, tmp: Path, *, records: int, chunk: int,
               eos: bool, interval: float | None = None) -> dict[str, Any]:
    src, out = _fresh(kafka, "src", 2), _fresh(kafka, "out", 1)
    kafka.produce(src, (b"%08d" % i for i in range(records)),
                  producer_config={"batch.size": "65536", "linger.ms": "20"})
    stamps = tempfile.mkdtemp(dir=tmp)
    group = f"bench-eos-{uuid.uuid4().hex[:8]}"
    start = time.monotonic()
    summary = run_workers(spark, _stamp_calls(stamps), topics=src, group=group,
                          bootstrap_servers=kafka.bootstrap_servers, workers=2,
                          batch_format="arrow", chunk_size=chunk, output_topic=out,
                          **_eos_options(eos, interval), max_records=records,
                          starting_offsets="earliest", idle_timeout_s=30, on_progress=False)
    wall = time.monotonic() - start
    if summary.totals["accepted"] < records:
        raise RuntimeError(f"accepted {summary.totals['accepted']} of {records}: {summary}")
    span = _span_s(stamps)
    return {"records": records, "wall_s": round(wall, 2), "span_s": round(span, 2),
            "records_per_s": round(records / span, 1) if span else None,
            **{k: sum(int(w.get(k, 0)) for w in summary.workers)
               for k in ("transactions", "polls", "marker_wait_ms")}}


def phase_breakdown(totals: dict[str, int]) -> dict[str, dict[str, float]]:
    """Per phase (workers/phases.py): the sum and the longest (ms), and the sum per
    transaction (with a stream of small polls, about one transaction per poll)."""
    n = max(1, totals.get("transactions", 0) + totals.get("transactions_aborted", 0))
    return {phase: {"sum_ms": totals.get(f"{phase}_ms", 0),
                    "max_ms": totals.get(f"{phase}_max_ms", 0),
                    "per_txn_ms": round(totals.get(f"{phase}_ms", 0) / n, 1)}
            for phase in PHASES}


def _tail(seen: list[tuple[float, float]], t0: float) -> dict[str, Any]:
    """Latency percentiles, and when the slowest 1% were produced (s after the first record):
    a cluster there is one stall, a spread a steady cost."""
    lat = sorted(x for _, x in seen)
    p99 = lat[int(len(lat) * 0.99) - 1]
    slow = sorted(at - t0 for at, _ in sorted(seen, key=lambda s: s[1])[-max(1, len(seen) // 100):])
    return {"outputs_read": len(lat), "p50_ms": round(statistics.median(lat) * 1000, 1),
            "p99_ms": round(p99 * 1000, 1), "max_ms": round(lat[-1] * 1000, 1),
            "slowest_1pct_produced_at_s": [round(slow[0], 1), round(statistics.median(slow), 1),
                                           round(slow[-1], 1)]}


def latency(spark: Any, kafka: LocalKafka, tmp: Path, *, rate: int, seconds: float,
            chunk: int, eos: bool, interval: float | None = None,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    src, out = _fresh(kafka, "lsrc", 2), _fresh(kafka, "lout", 1)
    group = f"bench-eos-{uuid.uuid4().hex[:8]}"
    kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
    seen: list[tuple[float, float]] = []  # (produced at, latency)
    done = threading.Event()

    # A second reader whose fetches the broker holds 10 ms at most (the default, 500 ms, may
    # hold a read_committed fetch after a commit made records readable: markers.py): the
    # difference is the reader's own wait, not the workers'.
    quick: list[tuple[float, float]] = []

    def read(into: list[tuple[float, float]], conf: dict[str, Any]) -> None:
        c = Consumer({"bootstrap.servers": kafka.bootstrap_servers,
                      "group.id": f"{group}-r{len(conf)}", "auto.offset.reset": "earliest",
                      "isolation.level": "read_committed", **conf})
        c.subscribe([out])
        while not done.is_set():
            m = c.poll(0.2)
            if m is not None and m.error() is None and m.value():
                at = float(m.value() or b"0")
                into.append((at, time.time() - at))
        c.close()

    def produce() -> None:
        time.sleep(12)  # the workers start and join
        p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 1})
        t0 = time.monotonic()
        for i in range(int(rate * seconds)):
            while time.monotonic() < t0 + i / rate:
                time.sleep(0.0005)
            p.produce(src, value=repr(time.time()).encode())
            p.poll(0)
        p.flush(30)

    threads = [threading.Thread(target=read, args=(seen, {}), daemon=True),
               threading.Thread(target=produce, daemon=True),
               threading.Thread(target=read, args=(quick, {"fetch.wait.max.ms": 10}),
                                daemon=True)]
    for thread in threads:
        thread.start()
    stamps = tempfile.mkdtemp(dir=tmp)
    summary = run_workers(spark, _stamp_calls(stamps), topics=src, group=group,
                          bootstrap_servers=kafka.bootstrap_servers, workers=2,
                          batch_format="arrow", chunk_size=chunk, output_topic=out,
                          **_eos_options(eos, interval), **(extra or {}),
                          time_budget_s=12 + seconds + 5, on_progress=False)
    threads[1].join(60)
    time.sleep(2)
    done.set()
    threads[0].join(10)
    threads[2].join(10)
    if not seen or not quick:
        raise RuntimeError("no output was read")
    t = summary.totals
    fast = _tail(quick, min(at for at, _ in quick))
    return {**_tail(seen, min(at for at, _ in seen)),
            "reader_fetch_wait_10ms": {k: fast[k] for k in ("p50_ms", "p99_ms", "max_ms")},
            "load_avg_1m": round(os.getloadavg()[0], 1),
            **{k: t.get(k, 0) for k in ("transactions", "transactions_aborted", "released",
                                        "released_marker_wait")},
            "phases": phase_breakdown(t)}


def _print_phases(name: str, row: dict[str, Any]) -> None:
    """The phase breakdown of a latency run, one line per phase."""
    print(f"  {name}: p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, max {row['max_ms']} ms; "
          f"slowest 1% produced at {row['slowest_1pct_produced_at_s']} s; load "
          f"{row['load_avg_1m']}; a reader with fetch.wait.max.ms=10: "
          f"{row['reader_fetch_wait_10ms']}", flush=True)
    for phase, v in row["phases"].items():
        if v["sum_ms"] or v["max_ms"]:
            print(f"    {phase:16} sum {v['sum_ms']:7} ms  per txn {v['per_txn_ms']:7} ms  "
                  f"max {v['max_ms']:6} ms", flush=True)


def latency_rounds(spark: Any, kafka: LocalKafka, tmp: Path, args: argparse.Namespace,
                   ) -> dict[str, Any]:
    """``--rounds`` rounds of the latency at ``--rate`` with the default options, at-least-once
    and exactly-once side by side (and ``--compare`` variants), the phase breakdown of each."""
    variants: dict[str, tuple[bool, dict[str, Any]]] = {
        "at-least-once": (False, {}), "exactly-once": (True, {})}
    for spec in filter(None, (args.compare or "").split(";")):
        label, _, opts = spec.partition("=")
        variants[f"exactly-once {label}"] = (True, json.loads(opts))
    out: dict[str, Any] = {}
    for rnd in range(1, args.rounds + 1):
        for name, (eos, extra) in variants.items():
            row = latency(spark, kafka, tmp, rate=args.rate, seconds=args.seconds,
                          chunk=100, eos=eos, extra=extra)
            out[f"round {rnd} {name}"] = row
            _print_phases(f"round {rnd} {name} (rate {args.rate}/s)", row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--chunk-sizes", default="100,500")
    ap.add_argument("--rate", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the latency at the "
                    "default options (issue 40's target: every round)")
    ap.add_argument("--latency-only", action="store_true", help="only the latency rounds")
    ap.add_argument("--compare", help="exactly-once variants for the latency rounds: "
                    "'label={json options};...' (e.g. a previous default, side by side)")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--transaction-interval-s", type=float, default=None)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "load_avg": os.getloadavg(), "cpus": os.cpu_count(),
                               "transaction_interval_s": WorkerConfig.transaction_interval_s
                               if args.transaction_interval_s is None
                               else args.transaction_interval_s}
    with LocalKafka() as kafka, tempfile.TemporaryDirectory() as tmp:
        spark = local_spark("local[2]", "bench-workers-eos", log_level="ERROR")
        throughput(spark, kafka, Path(tmp), records=2000, chunk=100, eos=True)  # warm-up
        results["latency rounds"] = latency_rounds(spark, kafka, Path(tmp), args)
        for chunk in (int(c) for c in args.chunk_sizes.split(",") if not args.latency_only):
            for eos in (False, True):
                name = f"chunk={chunk} {'exactly-once' if eos else 'at-least-once'}"
                interval = args.transaction_interval_s
                row = {**throughput(spark, kafka, Path(tmp), records=args.records, chunk=chunk,
                                    eos=eos, interval=interval),
                       **latency(spark, kafka, Path(tmp), rate=args.rate,
                                 seconds=args.seconds, chunk=chunk, eos=eos,
                                 interval=interval)}
                results[name] = row
                print(name, json.dumps(row), flush=True)
            a = results[f"chunk={chunk} at-least-once"]["records_per_s"]
            e = results[f"chunk={chunk} exactly-once"]["records_per_s"]
            if a and e:
                results[f"chunk={chunk} ratio"] = round(e / a, 2)
                print(f"chunk={chunk}: exactly-once / at-least-once throughput = {e / a:.2f}x",
                      flush=True)
        results["load_avg_end"] = os.getloadavg()
        spark.stop()
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
