"""make demo: two share consumers split one partition on the embedded broker.

(The kafka-share source issue replaces this with the full PySpark pipeline.)
"""

from __future__ import annotations

import time
from collections import Counter

from confluent_kafka import AcknowledgeType, ShareConsumer

from pyspark_kafka_share.localkafka import LocalKafka


def main() -> None:
    with LocalKafka() as kafka:
        print(f"broker up at {kafka.bootstrap_servers}")
        kafka.create_topic("demo-orders", partitions=1)
        kafka.set_group_config("demo-workers", "share.auto.offset.reset", "earliest")
        total = kafka.produce("demo-orders", (f"order-{i}" for i in range(5000)),
                              producer_config={"batch.size": "4000"})
        print(f"produced {total} records to 1 partition")
        conf = {"bootstrap.servers": kafka.bootstrap_servers, "group.id": "demo-workers",
                "share.acknowledgement.mode": "explicit"}
        consumers = {name: ShareConsumer(conf) for name in ("worker-a", "worker-b")}
        for c in consumers.values():
            c.subscribe(["demo-orders"])
        got: Counter[str] = Counter()
        offsets: set[int] = set()
        deadline = time.monotonic() + 60
        while sum(got.values()) < total and time.monotonic() < deadline:
            for name, c in consumers.items():
                batch = c.poll(0.2)
                for msg in batch:
                    c.acknowledge(msg, AcknowledgeType.ACCEPT)
                    offsets.add(msg.offset())
                    got[name] += 1
                if len(batch):
                    c.commit_sync()
        for c in consumers.values():
            c.close()
        for name, n in sorted(got.items()):
            print(f"{name}: {n} records")
        ok = sum(got.values()) == total == len(offsets)
        print("every record delivered exactly once" if ok else "MISMATCH")
        if not ok:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
