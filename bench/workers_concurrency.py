"""Many calls in flight per queue worker (``concurrency``, issue 40), side by side in one run:
a function that waits ``--delay-ms`` on an HTTP service over loopback, ``--workers`` workers.

The service is an asyncio server in a process of its own (``_http_service.py``; its CPU is
printed apart from the rest of the machine's). Cases: an ``async def`` function with
``concurrency`` 1, 16 and 64 (``--levels``), the same levels with a plain function on threads
where asked (``--threads``), and the baseline a user writes today: a pandas batch function with
a thread pool of ``chunk_size`` threads inside each chunk (``--baseline-chunk``, the chunk
waits for its slowest call). Each case gets about ``--seconds`` of work at its ideal rate
(``workers * N * 1000 / delay-ms`` records/s); its rate is measured from the first call's start
to the last call's end, against that ideal. Results go to stdout and, with ``--out``, to a JSON
file.

    .venv/bin/python bench/workers_concurrency.py [--levels 1,16,64] [--seconds 10]
        [--out docs/benchmarks/workers_concurrency.json]
        [--plot docs/benchmarks/workers_concurrency.png] [--from-json FILE (plot only)]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pyspark_kafka_share.harness import LocalKafka, ProducerRecord, local_spark
from pyspark_kafka_share.workers import Record, run_workers

HERE = Path(__file__).resolve().parent


# ---- the functions (run in Spark's Python workers) --------------------------------------------

def _stamp(stamps: str, t0: float, n: int = 1) -> None:
    with open(os.path.join(stamps, f"{os.getpid()}.txt"), "a") as f:
        f.write(f"{t0} {time.time()} {n}\n")


def _async_call(port: int, stamps: str) -> Any:
    import asyncio

    async def call(rec: Record) -> None:
        t0 = time.time()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
            response = await reader.read()
        finally:
            writer.close()
        if not response.startswith(b"HTTP/1.1 200"):
            raise ConnectionError(response[:40])
        _stamp(stamps, t0)

    return call


def _get(port: int) -> None:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/", headers={"Connection": "close"})
        if conn.getresponse().status != 200:
            raise ConnectionError("not 200")
    finally:
        conn.close()


def _thread_call(port: int, stamps: str) -> Any:
    def call(rec: Record) -> None:
        t0 = time.time()
        _get(port)
        _stamp(stamps, t0)

    return call


def _pool_in_chunk(port: int, stamps: str) -> Any:
    """What a user writes without ``concurrency``: a pool inside each pandas chunk."""

    def call(frame: Any) -> None:
        from concurrent.futures import ThreadPoolExecutor

        t0 = time.time()
        with ThreadPoolExecutor(max_workers=len(frame)) as pool:
            list(pool.map(lambda _: _get(port), range(len(frame))))
        _stamp(stamps, t0, len(frame))

    return call


# ---- the cases --------------------------------------------------------------------------------

def _span(stamps: str) -> tuple[float, int]:
    rows = [line.split() for p in Path(stamps).iterdir() for line in p.read_text().splitlines()]
    if not rows:
        return 0.0, 0
    return (max(float(r[1]) for r in rows) - min(float(r[0]) for r in rows),
            sum(int(r[2]) for r in rows))


def run_case(spark: Any, kafka: LocalKafka, tmp: Path, *, name: str, fn: Any, records: int,
             workers: int, ideal: float, **options: Any) -> dict[str, Any]:
    src = kafka.create_topic(f"bench-conc-{uuid.uuid4().hex[:8]}", workers)
    # Small producer batches: the broker hands a share consumer whole batches whatever its
    # max.poll.records, and a poll far larger than the slots can finish within the lock is
    # mostly RELEASEd at the deadline (a first run with 64 KB batches released 1,713 of 2,560).
    # Record i to partition i % workers: unkeyed, librdkafka's sticky partitioner put 11,987 of
    # 12,800 records into one partition of four (2026-11-28), and one worker did most of it.
    kafka.produce(src, (ProducerRecord(value=b"%08d" % i, partition=i % workers)
                        for i in range(records)),
                  producer_config={"batch.size": "2048", "linger.ms": "5"})
    stamps = tempfile.mkdtemp(dir=tmp)
    cpu0 = _machine_cpu_s()
    summary = run_workers(spark, fn(stamps), topics=src, group=f"bench-conc-{uuid.uuid4().hex}",
                          bootstrap_servers=kafka.bootstrap_servers, workers=workers,
                          max_records=records, starting_offsets="earliest", idle_timeout_s=20,
                          on_progress=False, **options)
    cpu = _machine_cpu_s() - cpu0
    span, calls = _span(stamps)
    rate = calls / span if span else 0.0
    row = {"case": name, "records": records, "calls_done": calls, "span_s": round(span, 2),
           "records_per_s": round(rate, 1), "ideal_per_s": round(ideal, 1),
           "of_ideal": round(rate / ideal, 2), "slots_filled": round(summary.slots_filled, 2),
           "machine_cpu_s": round(cpu, 1), "released": summary.totals["released"],
           "released_in_flight": summary.totals["released_in_flight"]}
    print(json.dumps(row), flush=True)
    return row


def _machine_cpu_s() -> float:
    """CPU seconds the whole machine spent (all processes: workers, Spark, the broker and the
    service), from /proc/stat."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    busy = sum(int(v) for i, v in enumerate(fields) if i not in (3, 4))  # not idle, iowait
    return busy / os.sysconf("SC_CLK_TCK")


def plot(results: dict[str, Any], path: Path) -> None:
    """Each case's rate against its ideal (bars), and the share of the ideal (labels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = results["cases"]
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(cases) + 1.6))
    ys = list(range(len(cases)))
    ax.barh([y + 0.2 for y in ys], [c["ideal_per_s"] for c in cases], height=0.4,
            label="ideal", color="lightgray")
    ax.barh([y - 0.2 for y in ys], [c["records_per_s"] for c in cases], height=0.4,
            label="measured")
    for y, c in zip(ys, cases, strict=True):
        ax.text(c["records_per_s"], y - 0.2, f" {c['of_ideal']:.2f}x", va="center", fontsize=8)
    ax.set_yticks(ys, [c["case"] for c in cases], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")  # 1 call in flight against 64: two orders of magnitude
    ax.set_xlabel("records/s (log scale)")
    ax.set_title(f"{results['workers']} queue workers, a {results['delay_ms']:.0f} ms HTTP "
                 "call per record")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,16,64")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--delay-ms", type=float, default=200.0)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--threads", default="64", help="levels also run on threads ('' for none)")
    ap.add_argument("--baseline-chunk", type=int, default=64)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--plot", type=Path, help="a PNG of the results (needs matplotlib)")
    ap.add_argument("--from-json", type=Path, help="only plot these results")
    args = ap.parse_args(argv)
    if args.from_json is not None:
        plot(json.loads(args.from_json.read_text()), args.plot or Path("concurrency.png"))
        return 0
    results = measure(args)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    if args.plot:
        plot(results, args.plot)
    return 0


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every case once, with the service started for the run and stopped after it."""
    per_call = 1000 / args.delay_ms
    service = subprocess.Popen([sys.executable, str(HERE / "_http_service.py"),
                                "--delay-ms", str(args.delay_ms)], stdout=subprocess.PIPE,
                               text=True)
    assert service.stdout is not None
    port = int(service.stdout.readline())
    results: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "load_avg": os.getloadavg(), "cpus": os.cpu_count(),
                               "workers": args.workers, "delay_ms": args.delay_ms, "cases": []}
    try:
        with LocalKafka() as kafka, tempfile.TemporaryDirectory() as tmp:
            spark = local_spark(f"local[{args.workers}]", "bench-workers-concurrency",
                                log_level="ERROR")
            cases: list[tuple[str, Any, int, dict[str, Any]]] = [
                (f"async, concurrency={n}", _async_call, n, {"concurrency": n})
                for n in (int(x) for x in args.levels.split(","))]
            cases += [(f"threads, concurrency={n}", _thread_call, n, {"concurrency": n})
                      for n in (int(x) for x in args.threads.split(",") if x)]
            b = args.baseline_chunk
            cases.append((f"baseline: pandas chunk_size={b}, a pool of {b} threads in it",
                          _pool_in_chunk, b, {"batch_format": "pandas", "chunk_size": b}))
            for name, make, n, options in cases:
                ideal = args.workers * n * per_call
                results["cases"].append(run_case(
                    spark, kafka, Path(tmp), name=name,
                    fn=lambda stamps, make=make: make(port, stamps),
                    records=max(40, int(ideal * args.seconds)), workers=args.workers,
                    ideal=ideal, **options))
            spark.stop()
    finally:
        service.terminate()
        out, _ = service.communicate(timeout=30)
        results["service_cpu_s"] = float(out.strip().rsplit("cpu_s=", 1)[-1] or 0)
    results["load_avg_end"] = os.getloadavg()
    print(f"the HTTP service's own CPU: {results['service_cpu_s']} s (the machine's per case: "
          "machine_cpu_s, the service's included)", flush=True)
    return results


if __name__ == "__main__":
    sys.exit(main())
