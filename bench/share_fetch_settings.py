"""Which share-fetch settings librdkafka's ShareConsumer honours: records per poll under a
paced stream, per setting.

    python bench/share_fetch_settings.py [--rate 2000] [--seconds 20] [--partitions 4]

A producer sends ``--rate`` records/s of 200 bytes into a fresh topic; for each setting a new
share group's explicit-mode consumer (the source's :class:`ShareSession`, as a task uses it:
``poll(0.2)``, ACCEPT, ``commit_sync``) polls for ``--seconds``. Printed per setting: the polls
with records, records per such poll (mean, median, max) and the mean time between them. A
setting the consumer honours changes those: ``fetch.min.bytes`` with ``fetch.wait.max.ms``
(the broker holds the ShareFetch until that many bytes or that long), ``max.poll.records``
(ShareFetch MaxRecords; the broker still hands out whole producer batches).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from journal_real import _pace

from pyspark_kafka_share._kafka.share import ShareSession
from pyspark_kafka_share.harness import LocalKafka

SETTINGS: list[tuple[str, dict[str, str]]] = [
    ("librdkafka defaults (wait 500 ms, min 1 byte), max.poll.records 2000", {}),
    ("fetch.min.bytes 1 MB, fetch.wait.max.ms 500",
     {"fetch.min.bytes": "1048576", "fetch.wait.max.ms": "500"}),
    ("fetch.min.bytes 1 MB, fetch.wait.max.ms 2000",
     {"fetch.min.bytes": "1048576", "fetch.wait.max.ms": "2000"}),
    ("fetch.min.bytes 100 kB, fetch.wait.max.ms 5000",
     {"fetch.min.bytes": "102400", "fetch.wait.max.ms": "5000"}),
    ("max.poll.records 100", {"max.poll.records": "100"}),
]


def measure(kafka: LocalKafka, topic: str, extra: dict[str, str], seconds: float) -> str:
    group = f"fetch-settings-{uuid.uuid4().hex[:8]}"
    kafka.set_group_config(group, "share.auto.offset.reset", "latest")
    config = {"bootstrap.servers": kafka.bootstrap_servers, "group.id": group,
              "share.acknowledgement.mode": "explicit", "max.poll.records": "2000", **extra}
    session = ShareSession.open(config, [topic], 30.0)
    sizes: list[int] = []
    stamps: list[float] = []
    try:
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            msgs, _ = session.poll(0.2)
            if msgs:
                sizes.append(len(msgs))
                stamps.append(time.monotonic())
                session.settle(accept=msgs)
    finally:
        session.close()
    if not sizes:
        return "no records"
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    gap = f"{statistics.mean(gaps) * 1000:.0f} ms" if gaps else "-"
    return (f"{len(sizes)} polls with records, records per poll mean "
            f"{statistics.mean(sizes):.0f}, median {statistics.median(sizes):.0f}, max "
            f"{max(sizes)}; {gap} between them")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--partitions", type=int, default=4)
    args = ap.parse_args()
    with LocalKafka() as kafka:
        topic = kafka.create_topic(f"fetch-settings-{uuid.uuid4().hex[:6]}", args.partitions)
        stop, sent = threading.Event(), [0]
        producer = threading.Thread(target=_pace, args=(kafka, topic, args.rate, stop, sent),
                                    daemon=True)
        producer.start()
        try:
            time.sleep(2)
            print(f"{args.rate} records/s of 200 bytes into {args.partitions} partitions, "
                  f"{args.seconds:g} s per setting (after the group's join)")
            for name, extra in SETTINGS:
                print(f"- {name}: {measure(kafka, topic, extra, args.seconds)}", flush=True)
        finally:
            stop.set()
            producer.join(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
