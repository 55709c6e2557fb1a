"""Why a skewed topic's big partition gets no help: two broker behaviours, measured with the
native share consumer on one LocalKafka broker (docs/design.md, "A skewed topic: assignment
and the lock limit")::

    .venv/bin/python bench/share_locks.py [--records 6000]

1. The lock limit: member A of a group polls a 1-partition topic without acknowledging; what
   does member B get meanwhile, and once A ACCEPTs 1,000?
2. The assignment: which partitions of a 4-partition topic 2, 4, 5 and 8 members are given.
"""

from __future__ import annotations

import argparse
import time

from pyspark_kafka_share._kafka.native.consumer import NativeConsumerConfig, NativeShareConsumer
from pyspark_kafka_share.harness import LocalKafka

POLL_S = 6.0  # each member's polling span
JOIN_S = 10.0  # the members' time to join and get assignments (a few heartbeats)


def consumer(kafka: LocalKafka, group: str, topic: str) -> NativeShareConsumer:
    return NativeShareConsumer(NativeConsumerConfig(kafka.bootstrap_servers, group), [topic])


def poll_for(c: NativeShareConsumer, seconds: float) -> int:
    """Records ``c`` acquires in ``seconds`` of polls (none acknowledged)."""
    got, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        got += len(c.poll(0.5))
    return got


def lock_limit(kafka: LocalKafka, records: int) -> None:
    topic, group = kafka.create_topic("locks", 1), "locks-g"
    kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
    kafka.produce(topic, (b"x" * 100 for _ in range(records)),
                  producer_config={"batch.size": "16384", "linger.ms": "50"})
    with consumer(kafka, group, topic) as a, consumer(kafka, group, topic) as b:
        a.poll(0.01)
        b.poll(0.01)
        time.sleep(JOIN_S)  # both members assigned before A takes anything
        held = poll_for(a, POLL_S)
        print(f"A holds {held} of {records} records unacknowledged after {POLL_S:g} s of polls")
        print(f"B got {poll_for(b, POLL_S)} in {POLL_S:g} s meanwhile")
        for rec in a.held()[:1000]:
            a.acknowledge(rec, "ACCEPT")
        a.commit_sync()
        print(f"once A ACCEPTed 1000, B got {poll_for(b, POLL_S)} in {POLL_S:g} s")


def assignment(kafka: LocalKafka) -> None:
    for members in (2, 4, 5, 8):
        topic, group = kafka.create_topic(f"assign-{members}", 4), f"assign-{members}-g"
        cs = [consumer(kafka, group, topic) for _ in range(members)]
        try:
            for c in cs:
                c.poll(0.01)
            time.sleep(JOIN_S)
            for c in cs:
                c.poll(0.01)
            parts = sorted(tuple(p for ps in c._membership.assignment().values() for p in ps)
                           for c in cs)
            print(f"{members} members on 4 partitions: {parts}")
        finally:
            for c in cs:
                c.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=6000)
    args = ap.parse_args()
    with LocalKafka() as kafka:
        lock_limit(kafka, args.records)
        assignment(kafka)


if __name__ == "__main__":
    main()
