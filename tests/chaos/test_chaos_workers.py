"""Chaos for the queue workers with exactly-once outputs: a steady producer, two workers with
``exactly_once_outputs=True`` (outputs and a dead-letter topic), and a seeded schedule of real
faults (the same ``CHAOS_SEED`` as the source's chaos test):

- two fault points planned at start, on attempt 0 of each worker: the Python worker dies
  (``os._exit``) after a transaction's commit (before its ACCEPTs), between its produce and
  its commit, or while the commit runs; at a seeded transaction number;
- a busy Python worker SIGKILLed from outside;
- the broker SIGKILLed, down for seconds, restarted on its data.

The workers' client is ``$CHAOS_CLIENT`` (``librdkafka`` by default, ``native``: the package's
own share consumer; tests/chaos/chaos_schedule.py). Then production stops, the workers drain
the group (lag 0), and a ``read_committed`` reader of
the output and dead-letter topics must see every produced record exactly once. The workers'
``marker_conflicts`` (a canary, docs/design.md) and ``marker_overlaps_aborted`` (transactions
the commit check aborted on another attempt's marker) are reported, whatever they are.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from collections.abc import Callable

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share.harness import LocalKafka
from pyspark_kafka_share.workers import Record, Result, start_workers
from pyspark_kafka_share.workers.config import ShareClient
from tests.chaos.chaos_harness import SparkTasks, SteadyProducer, crash_broker, group_lag
from tests.chaos.chaos_harness import kill_busy_worker as kill_worker
from tests.chaos.chaos_schedule import ChaosConfig, chaos_clients
from tests.helpers import read_topic, wait_for, worker_faults

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

RECORDS = 1_200
RATE = 60.0  # records/s: 20 s of production
POINTS = ("kill-after-commit", "kill-before-commit", "kill-during-commit")



def _work(rec: Record) -> Result:
    value = rec.value or b""
    if int(value) % 50 == 0:
        return Result.reject("poison")
    return Result.accept(value)


@pytest.mark.chaos
@pytest.mark.timeout(600)
@pytest.mark.parametrize("client", chaos_clients())
def test_workers_outputs_exactly_once_under_a_seeded_fault_schedule(
    chaos_kafka: LocalKafka, spark: SparkSession, chaos_report: Callable[[str], None],
    client: ShareClient,
) -> None:
    kafka = chaos_kafka
    seed = ChaosConfig.from_env().seed
    rng = random.Random(seed)
    points = [f"{rng.choice(POINTS)}:part={w}:attempt=0:seq={rng.randrange(2, 8)}:ms=3"
              for w in (0, 1)]
    external = sorted([(round(rng.uniform(6, 10), 1), "worker-sigkill"),
                       (round(rng.uniform(12, 16), 1), "broker-crash")])
    down_s = round(rng.uniform(1.0, 5.0), 1)
    chaos_report(f"workers chaos seed={seed}, client={client}: {RECORDS} records at "
                 f"{RATE:.0f}/s; fault points {points}; then {external} (broker down {down_s}s)")
    src = kafka.create_topic("workers-chaos", 2)
    out, dlq = kafka.create_topic("workers-out", 1), kafka.create_topic("workers-dlq", 1)
    group = "workers-chaos"
    kafka.set_group_config(group, "share.auto.offset.reset", "earliest")
    kafka.set_group_config(group, "share.record.lock.duration.ms", 8_000)
    kafka.set_group_config(group, "share.delivery.count.limit", 10)
    producer = SteadyProducer(kafka.bootstrap_servers, src, 2, RATE, RECORDS)
    job = start_workers(spark, _work, topics=src, group=group, client=client,
                        bootstrap_servers=kafka.bootstrap_servers, workers=2, chunk_size=10,
                        output_topic=out, dead_letter_topic=dlq, exactly_once_outputs=True,
                        max_attempts=10, broker_timeout_s=60, on_progress=False,
                        **worker_faults(";".join(points)))
    began = time.monotonic()
    producer.start()
    for at, kind in external:
        time.sleep(max(0.0, at - (time.monotonic() - began)))
        what = kill_worker(SparkTasks(spark), rng.randrange(4)) if kind == "worker-sigkill" \
            else crash_broker(kafka, down_s, chaos_report)
        chaos_report(f"  t={time.monotonic() - began:5.1f}s {kind}: {what}")
    producer.finish()
    producer.join(300)
    wait_for(lambda: group_lag(kafka.bootstrap_servers, group, src),
             lambda lag: len(lag) == 2 and all(v == 0 for v in lag.values()), timeout_s=240,
             what="the workers drain the group (lag 0)")
    summary = job.stop()
    assert summary is not None
    stats = Counter[str]()
    for w in summary.workers:
        stats.update({k: int(v) for k, v in w.items() if isinstance(v, int)
                      and k in ("transactions", "transactions_aborted", "already_committed",
                                "marker_conflicts", "marker_overlaps_aborted",
                                "producers_replaced",
                                "unchecked_last_deliveries")})
    chaos_report(f"  workers: {len(summary.failed_attempts)} attempt(s) died; {dict(stats)}")
    produced = set(producer.delivered)
    poison = {v for v in produced if v % 50 == 0}
    outputs = Counter(int(m.value() or b"-1") for m in read_topic(kafka, out, len(produced)
                                                                   - len(poison), settle_s=2))
    dead = Counter(int(m.value() or b"-1") for m in read_topic(kafka, dlq, len(poison),
                                                               settle_s=2))
    dups = [v for v, c in (outputs + dead).items() if c > 1]
    lost = produced - set(outputs) - set(dead)
    chaos_report(f"  verdict: {len(produced)} produced, {sum(outputs.values())} outputs, "
                 f"{sum(dead.values())} dead letters, {len(dups)} duplicated, {len(lost)} "
                 f"lost, marker_conflicts={stats['marker_conflicts']}")
    assert not dups, f"{len(dups)} records twice (read_committed), e.g. {dups[:5]}"
    assert not lost, f"{len(lost)} records lost, e.g. {sorted(lost)[:5]}"
    assert set(dead) == poison
