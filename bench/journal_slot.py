"""What one journal slot costs: local filesystem (fsync on/off) against S3 (LocalS3, moto),
for both journal contents (``offsets``, the default: runs of offsets and a checksum;
``records``: the records). Reported per store and content: slots per second and journal
bytes per record besides the latencies.

Per poll, a task publishes one slot (exclusive create) and re-reads the ``committed`` fence;
that pair is "slot" below. Also measured: opening a log (fence + listing + first bytes of the
last slot), ENDing it, and a commit of one batch with a 20-slot log.

    .venv/bin/python bench/journal_slot.py [--slots 200] [--records 2000] [--value-bytes 100]

The S3 figures are against moto on loopback (a Python server): they show the journal's request
pattern and client overhead, not S3's latency (add the store's round trips: see
docs/benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from pyspark_kafka_share._kafka.arrow import arrow_schema
from pyspark_kafka_share.source.journal.journal import EndMarker, Journal
from pyspark_kafka_share.source.journal.slots import CONTENTS, Content


def _batch(records: int, value_bytes: int, start: int) -> pa.RecordBatch:
    offsets = list(range(start, start + records))
    cols = {"key": [None] * records, "value": [b"x" * value_bytes] * records,
            "topic": ["orders"] * records, "partition": [0] * records, "offset": offsets,
            "timestamp": [None] * records, "timestampType": [0] * records,
            "deliveryCount": [1] * records}
    return pa.RecordBatch.from_pydict(cols, schema=arrow_schema(False))


def _ms(samples: list[float]) -> str:
    s = sorted(samples)
    return f"median {statistics.median(s) * 1e3:6.2f} ms  p90 {s[int(len(s) * 0.9)] * 1e3:6.2f} ms"


def _measure(journal_for: Callable[[], Journal], slots: int, records: int,
             value_bytes: int) -> dict[str, list[float]]:
    batch = _batch(records, value_bytes, 0)
    j = journal_for()
    out: dict[str, list[float]] = {"slot": [], "create": [], "fence": [], "open": [],
                                   "read_all": [], "end": [], "commit": [], "bytes": []}
    log = j.part_log(1, 0)
    log.open()
    for _ in range(slots):
        t = time.perf_counter()
        log.append(batch, attempt=1)
        out["bytes"].append(log.last_slot_bytes)
        t1 = time.perf_counter()
        j.committed_seq()  # the fence a task re-reads after every append
        t2 = time.perf_counter()
        out["slot"].append(t2 - t)
        out["create"].append(t1 - t)
        out["fence"].append(t2 - t1)
    for seq in range(2, 22):
        log = j.part_log(seq, 0)
        log.open()
        for _ in range(20):
            log.append(batch, attempt=1)
        t = time.perf_counter()
        j.part_log(seq, 0).open()
        out["open"].append(time.perf_counter() - t)
        t = time.perf_counter()
        for slot in range(20):  # what finding END cost before: every slot read whole
            j.store.read(log.slot_path(slot))
        out["read_all"].append(time.perf_counter() - t)
        t = time.perf_counter()
        log.end(lambda s: EndMarker(attempt=1, data_slots=len(s.data_slots), records=0,
                                    acked_slots=tuple(s.data_slots)))
        out["end"].append(time.perf_counter() - t)
        t = time.perf_counter()
        j.commit(seq, dedup_retention_ms=3_600_000, start_offsets={})
        out["commit"].append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", type=int, default=200)
    ap.add_argument("--records", type=int, default=2000, help="records per slot (one poll)")
    ap.add_argument("--value-bytes", type=int, default=100)
    args = ap.parse_args()
    print(f"slot = {args.records} records of {args.value_bytes} B values "
          f"(Arrow IPC {_batch(args.records, args.value_bytes, 0).nbytes / 1e3:.0f} kB in memory)")
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fsync in (True, False):
            for content in CONTENTS:
                def local(fsync: bool = fsync, content: Content = content) -> Journal:
                    return Journal(f"{tmp}/{uuid.uuid4().hex}", fsync=fsync, content=content)

                results[f"local fsync={str(fsync).lower()} content={content}"] = _measure(
                    local, args.slots, args.records, args.value_bytes)
    from pyspark_kafka_share.harness.s3 import LocalS3

    with LocalS3() as s3:
        s3.create_bucket("bench-journal")
        opts: dict[str, Any] = {k.removeprefix("journal."): v
                                for k, v in s3.journal_options().items()}
        for content in CONTENTS:
            def remote(content: Content = content) -> Journal:
                return Journal(f"s3://bench-journal/{uuid.uuid4().hex}", options=opts,
                               content=content)

            results[f"s3 (moto, loopback) content={content}"] = _measure(
                remote, args.slots, args.records, args.value_bytes)
    for name, res in results.items():
        print(f"\n{name}")
        print(f"  slots/s (create + fence)     {1 / statistics.median(res['slot']):8.1f}")
        per_record = statistics.median(res["bytes"]) / args.records
        print(f"  journal bytes per record     {per_record:8.2f}")
        print(f"  slot (create + fence read)   {_ms(res['slot'])}")
        print(f"    exclusive create           {_ms(res['create'])}")
        print(f"    fence read                 {_ms(res['fence'])}")
        print(f"  open a 20-slot log           {_ms(res['open'])}")
        print(f"  read all 20 slots (old scan) {_ms(res['read_all'])}")
        print(f"  END                          {_ms(res['end'])}")
        print(f"  commit (20 acked slots)      {_ms(res['commit'])}")


if __name__ == "__main__":
    main()
