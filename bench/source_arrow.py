"""A fetch into the source's Arrow rows, in-process: the native client's per-record path
(``ShareRecord`` per record, read as messages by ``messages_to_batch``) against the Arrow path
(``_kafka/native/columns.py``: decoded into columns, no object per record), issue 39 item 2.

Fetches of ``--fetch`` records (producer batches of ``--batch``, uncompressed values of
``--value-bytes``, no key, no header), built byte by byte as a broker returns them, every
record acquired; each path turns all of them into Arrow batches of the source's schema. The
machine may be shared: each path runs ``--runs`` times, the fastest run is the figure::

    .venv/bin/python bench/source_arrow.py [--records 1000000] [--path both|records|arrow]

``--path records`` also runs against an older checkout of ``src`` (PYTHONPATH) for a
before/after of the whole chain: the per-record path is the one the source used before.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable

from pyspark_kafka_share._kafka.arrow import messages_to_batch
from pyspark_kafka_share._kafka.native.adapter import NativeMessage
from pyspark_kafka_share._kafka.native.consumer import NativeConsumerConfig, NativeShareConsumer
from pyspark_kafka_share._kafka.native.session import Held
from pyspark_kafka_share._kafka.protocol.consume import AcquiredRange, SharePartitionAnswer
from pyspark_kafka_share.harness.record_batches import batch, record

TID, TOPIC = "bench-topic-id", "bench"


def _batch(base: int, n: int, value_bytes: int) -> bytes:
    """A record batch v2 of ``n`` records (offsets ``base``...): null key, no headers."""
    return batch(base, [record(i, i, None, (b"value-%09d-" % (base + i)).ljust(value_bytes, b"x"))
                        for i in range(n)], base_ts=1_700_000_000_000,
                 max_ts=1_700_000_000_000 + n)


def fetches(records: int, per_fetch: int, per_batch: int,
            value_bytes: int) -> list[SharePartitionAnswer]:
    """``records`` records as ShareFetch partitions of ``per_fetch`` each, all acquired."""
    out = []
    for first in range(0, records, per_fetch):
        n = min(per_fetch, records - first)
        data = b"".join(_batch(b, min(per_batch, first + n - b), value_bytes)
                        for b in range(first, first + n, per_batch))
        out.append(SharePartitionAnswer(TID, 0, 0, None, 0, None, -1, -1, data,
                                        (AcquiredRange(first, first + n - 1, 1),)))
    return out


def _consumer() -> NativeShareConsumer:
    """A consumer with no connection: only its decoding is run."""
    consumer = NativeShareConsumer.__new__(NativeShareConsumer)
    consumer.config = NativeConsumerConfig("unused:9092", "bench")
    consumer._held, consumer._names, consumer.batch_codecs = Held(), {TID: TOPIC}, Counter()
    return consumer


def per_record(parts: list[SharePartitionAnswer]) -> int:
    consumer, rows = _consumer(), 0
    for part in parts:
        consumer._held = Held()
        msgs = [NativeMessage(r) for r in consumer._acquired(part, time.monotonic() + 30)]
        rows += messages_to_batch(msgs, False).num_rows
    return rows


def arrow(parts: list[SharePartitionAnswer]) -> int:
    from pyspark_kafka_share._kafka.native.columns import acquired_batch

    rows = 0
    for part in parts:
        rows += acquired_batch(part.records or b"", part.acquired, TOPIC, (TID, 0), Held(),
                               check_crc=True, include_headers=False,
                               codecs=Counter()).num_rows
    return rows


def fastest(run: Callable[[list[SharePartitionAnswer]], int],
            parts: list[SharePartitionAnswer], runs: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run(parts)
        times.append(time.perf_counter() - start)
    return min(times), times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--fetch", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--path", choices=("both", "records", "arrow"), default="both")
    args = ap.parse_args()
    parts = fetches(args.records, args.fetch, args.batch, args.value_bytes)
    paths = {"records": per_record, "arrow": arrow}
    chosen = list(paths) if args.path == "both" else [args.path]
    rates = {}
    for name in chosen:
        best, times = fastest(paths[name], parts, args.runs)
        rates[name] = args.records / best
        print(f"{name:>8}: {rates[name]:>10,.0f} records/s (fastest of "
              f"{', '.join(f'{t:.2f}' for t in times)} s)")
    if len(rates) == 2:
        print(f"   ratio: arrow / records = {rates['arrow'] / rates['records']:.2f}x")


if __name__ == "__main__":
    main()
