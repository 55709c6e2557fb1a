"""make demo-workers: queue workers scoring transactions on an embedded Kafka broker.

1. start a local Kafka broker and produce 3,000 transactions to a 2-partition topic; a few are
   malformed (poison) and the "fraud service" times out on first contact for some others;
2. run 4 queue workers as Spark tasks (more workers than partitions) with a small Python model:
   each record is scored and the score produced to the topic 'scores' (flushed before the record
   is ACCEPTed); timeouts are RELEASEd and retried; malformed records go to 'transactions-dlq'
   with the error in headers, then are REJECTed;
3. stop when the queue has been idle for 5 s, print the summary and verify the topics.

The demo prints only its own lines (and the workers' progress): the log lines of the Kafka
clients, Spark (its JVM and Python workers) and the broker go to demo-output/workers-demo.log
(see ``_quiet.py``).
"""

from __future__ import annotations

import json
import math
import sys
import uuid
from collections import Counter
from pathlib import Path

from _quiet import logs_to_file

from pyspark_kafka_share.harness import LocalKafka, ProducerRecord, local_spark
from pyspark_kafka_share.workers import Record, Result, run_workers

RECORDS = 3_000
WORKERS = 4
POISON_EVERY = 250  # malformed JSON
FLAKY_EVERY = 40  # the enrichment call times out on the first delivery
LOG = Path(__file__).resolve().parent.parent / "demo-output" / "workers-demo.log"


class EnrichmentTimeout(Exception):
    """A transient failure: the record is RELEASEd and retried."""


WEIGHTS = {"amount": 0.004, "night": 1.2, "foreign": 0.9}


def score(record: Record) -> Result:
    """The model: a logistic score of a transaction (plain Python, runs on the executors)."""
    tx = json.loads(record.value or b"")  # malformed JSON raises ValueError: poison
    if tx["id"] % FLAKY_EVERY == 0 and record.delivery_count == 1:
        raise EnrichmentTimeout(f"fraud service timed out for {tx['id']}")
    z = sum(WEIGHTS[k] * float(tx[k]) for k in WEIGHTS) - 3.0
    result = {"id": tx["id"], "score": round(1 / (1 + math.exp(-z)), 4),
              "attempt": record.delivery_count}
    return Result.accept(json.dumps(result))


def main() -> int:
    from confluent_kafka import Consumer

    LOG.unlink(missing_ok=True)
    with logs_to_file(LOG), LocalKafka() as kafka:
        print(f"      (log lines of the Kafka clients, Spark and the broker: {LOG})")
        print(f"[1/3] Kafka broker up at {kafka.bootstrap_servers}")
        for name, parts in (("transactions", 2), ("scores", 2), ("transactions-dlq", 1)):
            kafka.create_topic(name, parts)
        records = []
        for i in range(RECORDS):
            body = b"{not json" if i % POISON_EVERY == 7 else json.dumps({
                "id": i, "amount": (i * 37) % 900, "night": int(i % 5 == 0),
                "foreign": int(i % 7 == 0)}).encode()
            records.append(ProducerRecord(key=f"card-{i % 101}".encode(), value=body))
        kafka.produce("transactions", records, producer_config={"batch.size": "4096"})
        poison = sum(1 for i in range(RECORDS) if i % POISON_EVERY == 7)
        print(f"[1/3] produced {RECORDS} transactions ({poison} malformed)")

        # UI and console progress off (local_spark), Python workers run this interpreter.
        spark = local_spark(f"local[{WORKERS}, 4]", "workers-demo", log_level="ERROR")
        try:
            print(f"[2/3] {WORKERS} workers scoring (progress every 2 s)")
            summary = run_workers(
                spark, score, topics="transactions", group=f"scorers-{uuid.uuid4().hex[:6]}",
                bootstrap_servers=kafka.bootstrap_servers, workers=WORKERS,
                starting_offsets="earliest", output_topic="scores",
                dead_letter_topic="transactions-dlq", max_attempts=3,
                retry_on=(EnrichmentTimeout,), idle_timeout_s=5, progress_interval_s=2,
            )
        finally:
            spark.stop()
        print(summary)

        def read(topic: str) -> list[tuple[bytes | None, dict[str, bytes]]]:
            c = Consumer({"bootstrap.servers": kafka.bootstrap_servers,
                          "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"})
            c.subscribe([topic])
            out, empty = [], 0
            while empty < 6:
                m = c.poll(0.5)
                if m is None:
                    empty += 1
                    continue
                out.append((m.value(), dict(m.headers() or [])))
            c.close()
            return out

        scores = [json.loads(v or b"") for v, _ in read("scores")]
        dead = read("transactions-dlq")
        ids = Counter(s["id"] for s in scores)
        retried = sum(1 for s in scores if s["attempt"] > 1)
        print(f"[3/3] 'scores': {len(scores)} records, {len(ids)} distinct ids, {retried} "
              f"scored on a retry; 'transactions-dlq': {len(dead)} records")
        for value, headers in dead[:2]:
            print(f"      dead letter {value!r}: {headers['kafka-share.error'].decode()[:70]}")
        ok = (set(ids) == {i for i in range(RECORDS) if i % POISON_EVERY != 7}
              and len(dead) == poison and summary.totals["rejected"] == poison)
        dupes = sum(n - 1 for n in ids.values())
        if dupes:
            print(f"      {dupes} duplicate scores (at-least-once: see docs/workers.md)")
        print("OK: every transaction scored or dead-lettered" if ok else "MISMATCH")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
