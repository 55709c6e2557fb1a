"""``make chaos-scale`` (marker ``chaos_scale``; not in ``make test-brokers`` nor in CI): the
chaos test's steady stream and seeded fault schedule on the three-broker cluster behind
Toxiproxy, with the cluster's faults (node crashes, leader moves, latency, resets, blackholes,
slow drips: tests/brokers/chaos_scale.py) beside the source's (Python worker SIGKILLs and
exits, query restarts, a task past its lock); then the queue workers with exactly-once
outputs under the cluster's faults and worker SIGKILLs.

Sizes: ``CHAOS_SEED``, ``CHAOS_RECORDS``, ``CHAOS_FAULTS``, ``CHAOS_INTERVAL_S`` (the source's
run, as for ``make chaos``), ``CHAOS_WORKER_RECORDS`` and ``CHAOS_WORKER_FAULTS`` (the workers'
run). ``make chaos-scale`` sets 1,000,000 records and 100 faults for the source, 100,000
records and 25 faults for the workers; without them the sizes are ``make chaos``'s.

Both share clients take part: the source's query alternates its ``client`` option
(``librdkafka``, ``native``) from one start to the next on the same checkpoint and journal
(every query restart and every recovery switches), and the workers' run goes once per
client; ``CHAOS_CLIENT=native`` (or ``librdkafka``) runs one. With ``CHAOS_UPGRADE_TO`` (``make
chaos-scale``: the cluster starts on the oldest supported Kafka, 4.2.2, and the schedule's
middle fault is a rolling upgrade to 4.4.0; tests/brokers/chaos_scale.py).
``CHAOS_SPARK=cluster``: Spark is a standalone cluster (two workers, one executor each) and
the schedules SIGKILL its executors too (``executor-kill``); default ``local[2, 4]``.
"""

from __future__ import annotations

import os
import random
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from pyspark_kafka_share.harness import LocalKafka, LocalKafkaCluster, LocalSparkCluster, Toxiproxy
from pyspark_kafka_share.workers import Record, Result, WorkerSummary, start_workers
from pyspark_kafka_share.workers.config import ShareClient
from tests.brokers.chaos_scale import (
    CLUSTER_KINDS,
    EXECUTOR_KILL,
    LEADER_MOVE,
    NODE_CRASH,
    ROLLING_UPGRADE,
    SCALE_KINDS,
    cluster_fault,
    describe,
    scale_schedule,
    spark_mode,
    upgrade_target,
)
from tests.chaos.chaos_harness import (
    SparkTasks,
    SteadyProducer,
    configure_group,
    group_lag,
    kill_busy_worker,
    read_log,
)
from tests.chaos.chaos_schedule import WORKER_SIGKILL, ChaosConfig, Fault, chaos_clients
from tests.chaos.test_chaos import ChaosRun
from tests.helpers import read_topic, wait_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

CONFIG = ChaosConfig.from_env()
WORKERS_CONFIG = replace(CONFIG, records=int(os.environ.get("CHAOS_WORKER_RECORDS") or 3_000),
                         faults=int(os.environ.get("CHAOS_WORKER_FAULTS") or 7),
                         topic_partitions=2)  # the workers' source topic: leader-move's range

Report = Callable[[str], None]


@dataclass(frozen=True)
class ChaosSpark:
    """The run's Spark: ``local[2, 4]``, or with ``CHAOS_SPARK=cluster`` a standalone cluster
    (two workers of one executor each) whose executors the schedule SIGKILLs."""

    session: SparkSession
    cluster: LocalSparkCluster | None = None

    @property
    def kinds(self) -> tuple[str, ...]:
        """The fault kinds this Spark adds to a schedule."""
        return () if self.cluster is None else (EXECUTOR_KILL,)

    def kill_executor(self, fault: Fault) -> str:
        assert self.cluster is not None, "executor-kill needs CHAOS_SPARK=cluster"
        victim = self.cluster.kill_executor(fault.victim)
        return (f"SIGKILLed executor {victim.executor_id} (pid {victim.pid}) of Spark worker "
                f"{fault.victim}")


@pytest.fixture(scope="module")
def chaos_spark(request: pytest.FixtureRequest) -> Iterator[ChaosSpark]:
    if spark_mode() == "local":
        yield ChaosSpark(request.getfixturevalue("spark"))
        return
    cluster: LocalSparkCluster = request.getfixturevalue("cluster")
    # A workers job is one stage for its whole life and Spark counts each task's failures over
    # it: with Spark's default of 4, the 4th kill (executor or Python worker) of one worker's
    # task ends the job (seen: seed 20261129). A long-running job raises it (docs/workers.md).
    session = cluster.session("pyspark-kafka-share-chaos-scale",
                              conf={"spark.task.maxFailures": "100"})
    yield ChaosSpark(session, cluster)
    session.stop()


class ClusterChaosRun(ChaosRun):
    """The chaos test's run (query, producer, drain, verdict) with the cluster's faults."""

    def __init__(self, config: ChaosConfig, spark: ChaosSpark, cluster: LocalKafkaCluster,
                 broker: LocalKafka, toxiproxy: Toxiproxy, root: Path,
                 report: Report) -> None:
        super().__init__(config, spark.session, broker, root, report, chaos_clients())
        self.chaos_spark = spark
        self.cluster = cluster
        self.toxiproxy = toxiproxy

    def inject(self, fault: Fault) -> str:
        if fault.kind == EXECUTOR_KILL:
            return self.chaos_spark.kill_executor(fault)
        if fault.kind in (*CLUSTER_KINDS, ROLLING_UPGRADE):
            return cluster_fault(self.cluster, self.toxiproxy, fault, self.topic)
        return super().inject(fault)


@pytest.mark.chaos_scale
@pytest.mark.timeout(CONFIG.budget_s())
def test_every_record_lands_exactly_once_under_a_seeded_cluster_fault_schedule(
    chaos_spark: ChaosSpark, kafka_cluster: LocalKafkaCluster, cluster_broker: LocalKafka,
    toxiproxy: Toxiproxy, tmp_path: Path, fault_report: Report,
) -> None:
    config, seed = CONFIG, CONFIG.seed
    began = time.monotonic()
    upgrade = upgrade_target()
    schedule = scale_schedule(config, kinds=(*SCALE_KINDS, *chaos_spark.kinds),
                              upgrade_to=upgrade)
    fault_report(f"chaos-scale seed={seed}: {config.records} records, {len(schedule)} faults "
                 f"every ~{config.interval_s:.0f}s, Kafka {kafka_cluster.node(1).version}"
                 f"{f' upgraded to {upgrade}' if upgrade else ''}, clients "
                 f"{'/'.join(chaos_clients())} (replay: CHAOS_SEED={seed} CHAOS_RECORDS="
                 f"{config.records} CHAOS_FAULTS={config.faults} CHAOS_INTERVAL_S="
                 f"{config.interval_s:g} make chaos-scale)")
    for fault in schedule:
        fault_report(f"  scheduled {describe(fault)}")
    run = ClusterChaosRun(config, chaos_spark, kafka_cluster, cluster_broker, toxiproxy, tmp_path,
                          fault_report)
    try:
        run.start()
        run.run_faults(schedule)
        run.idle_until(config.chaos_s)
        run.producer.finish()
        run.producer.join(timeout_s=900)
        chaos_s = run.now()
        drain_s = run.drain(timeout_s=240 + config.records / 500)
    finally:
        run.query.stop()
    log = read_log(kafka_cluster.bootstrap_servers, run.topic, config.topic_partitions)
    lag = group_lag(kafka_cluster.bootstrap_servers, run.group, run.topic)
    verdict = run.verdict(log)
    kinds = dict(sorted(Counter(f.kind for f in schedule).items()))
    fault_report(f"chaos-scale seed={seed}: {verdict.expected} records, {verdict.sink_rows} "
                 f"rows; lost {verdict.lost}, duplicated {verdict.duplicated}, wrong value "
                 f"{verdict.wrong_value}; lag {lag}; faults {kinds}; query starts "
                 f"{run.query.starts} {dict(run.query.starts_by_client)}; failed task "
                 f"attempts {run.tasks.failed()}; chaos "
                 f"{chaos_s:.0f}s, drain {drain_s}, test {time.monotonic() - began:.0f}s")
    where = f"(seed {seed}; replay with CHAOS_SEED={seed})"
    assert not run.producer.errors, f"producer errors {where}: {run.producer.errors[:5]}"
    assert verdict.exactly_once, f"not exactly once {where}: {verdict}"
    assert lag and all(v == 0 for v in lag.values()), f"group lag is not 0 {where}: {lag}"
    assert drain_s is not None, f"the query did not drain {where}"


def _work(rec: Record) -> Result:
    value = rec.value or b""
    return Result.reject("poison") if int(value) % 50 == 0 else Result.accept(value)


@pytest.fixture(scope="module")
def secured_cluster() -> Iterator[LocalKafkaCluster]:
    """A three-node cluster of the module's own on SASL_SSL (SCRAM-SHA-512 over TLS, ACLs on;
    no proxy in front: its faults are node crashes, leader moves and worker SIGKILLs)."""
    with LocalKafkaCluster(security="sasl_ssl", session_timeout_ms=6_000, heap="512m",
                           delivery_count_limit=10) as c:
        yield c


@pytest.mark.chaos_scale
@pytest.mark.timeout(WORKERS_CONFIG.budget_s())
@pytest.mark.parametrize("client", chaos_clients())
def test_workers_outputs_exactly_once_under_a_seeded_cluster_fault_schedule(
    chaos_spark: ChaosSpark, kafka_cluster: LocalKafkaCluster, cluster_group: str,
    toxiproxy: Toxiproxy, fault_report: Report, client: ShareClient,
) -> None:
    """The workers on the tier's plaintext cluster behind Toxiproxy: every cluster fault."""
    _workers_chaos(chaos_spark, kafka_cluster, toxiproxy, cluster_group, client,
                   (WORKER_SIGKILL, *CLUSTER_KINDS), fault_report)


@pytest.mark.chaos_scale
@pytest.mark.brokers  # a cluster of its own: the tier's process (its fixture is not the tier's)
@pytest.mark.broker
@pytest.mark.timeout(WORKERS_CONFIG.budget_s())
def test_workers_outputs_exactly_once_on_sasl_ssl_under_node_faults(
    chaos_spark: ChaosSpark, secured_cluster: LocalKafkaCluster, fault_report: Report,
) -> None:
    """The workers (the last of the run's clients: ``native`` when both run) connected over
    SASL_SSL as the harness's admin user, under node crashes, leader moves and worker
    SIGKILLs."""
    group = f"chaos-scale-sec-{uuid.uuid4().hex[:8]}"
    secured_cluster.set_group_config(group, "share.auto.offset.reset", "earliest")
    _workers_chaos(chaos_spark, secured_cluster, None, group, chaos_clients()[-1],
                   (WORKER_SIGKILL, NODE_CRASH, LEADER_MOVE), fault_report)


def _workers_chaos(chaos_spark: ChaosSpark, cluster: LocalKafkaCluster, toxiproxy: Toxiproxy | None,
                   group: str, client: ShareClient, kinds: tuple[str, ...],
                   fault_report: Report) -> None:
    """Two exactly-once workers with a dead-letter topic under ``kinds`` of faults against a
    steady producer; a ``read_committed`` reader must see each record once among the
    outputs and dead letters."""
    config = WORKERS_CONFIG
    schedule = scale_schedule(config, kinds=(*kinds, *chaos_spark.kinds))
    spark = chaos_spark.session
    conf = cluster.client_config()
    fault_report(f"workers chaos-scale seed={config.seed}, client={client}, "
                 f"{conf.get('security.protocol', 'PLAINTEXT')}: {config.records} records, "
                 f"{config.faults} faults every ~{config.interval_s:.0f}s")
    tag = uuid.uuid4().hex[:8]
    src, out, dlq = (cluster.create_topic(f"chaos-scale-{name}-{tag}", n) for name, n in
                     (("src", config.topic_partitions), ("out", 1), ("dlq", 1)))
    configure_group(cluster, group, {"share.record.lock.duration.ms": 8_000,
                                     "share.delivery.count.limit": 10}, fault_report)
    bootstrap, connection = cluster.bootstrap_servers, cluster.connection_config()
    producer = SteadyProducer(bootstrap, src, config.topic_partitions, config.rate,
                              config.records, config=conf)
    job = start_workers(spark, _work, topics=src, group=group, client=client,
                        bootstrap_servers=bootstrap, connection=connection, workers=2,
                        chunk_size=10, output_topic=out, dead_letter_topic=dlq,
                        exactly_once_outputs=True, max_attempts=10, broker_timeout_s=60,
                        on_progress=False)
    rng = random.Random(config.seed)
    began = time.monotonic()
    producer.start()
    try:
        for fault in schedule:
            time.sleep(max(0.0, fault.at_s - (time.monotonic() - began)))
            if fault.kind == WORKER_SIGKILL:
                what = kill_busy_worker(SparkTasks(spark), rng.randrange(4))
            elif fault.kind == EXECUTOR_KILL:
                what = chaos_spark.kill_executor(fault)
            else:
                what = cluster_fault(cluster, toxiproxy, fault, src)
            fault_report(f"  t={time.monotonic() - began:6.1f}s {describe(fault)}: {what}")
        producer.finish()
        producer.join(900)
        wait_for(lambda: group_lag(bootstrap, group, src, connection),
                 lambda lag: len(lag) == 2 and all(v == 0 for v in lag.values()),
                 timeout_s=240 + config.records / 100, what="the workers drain the group")
    finally:
        summary = job.stop("the test is done", grace_s=120)
    assert summary is not None
    _workers_verdict(cluster, summary, set(producer.delivered), (out, dlq),
                     f"seed={config.seed}, client={client}", fault_report)


def _workers_verdict(cluster: LocalKafkaCluster, summary: WorkerSummary, produced: set[int],
                     topics: tuple[str, str], what: str, fault_report: Report) -> None:
    out, dlq = topics
    stats = Counter[str]()
    for w in summary.workers:
        stats.update({k: int(w.get(k, 0)) for k in ("transactions", "transactions_aborted",
                                                     "already_committed", "marker_conflicts",
                                                     "marker_overlaps_aborted")})
    poison = {v for v in produced if v % 50 == 0}
    kafka, conf = cluster.node(cluster.node_ids[0]), cluster.client_config()
    outputs = Counter(int(m.value() or b"-1") for m in read_topic(
        kafka, out, len(produced) - len(poison), timeout_s=300, settle_s=2, config=conf))
    dead = Counter(int(m.value() or b"-1") for m in read_topic(
        kafka, dlq, len(poison), settle_s=2, config=conf))
    dups = [v for v, c in (outputs + dead).items() if c > 1]
    lost = produced - set(outputs) - set(dead)
    fault_report(f"workers chaos-scale {what}: {len(produced)} produced, "
                 f"{sum(outputs.values())} outputs, {sum(dead.values())} dead letters, "
                 f"{len(dups)} duplicated, {len(lost)} lost; {len(summary.failed_attempts)} "
                 f"attempt(s) died; {dict(stats)} (marker_conflicts: a canary, docs/design.md)")
    assert not dups, f"{len(dups)} records twice (read_committed), e.g. {dups[:5]}"
    assert not lost, f"{len(lost)} records lost, e.g. {sorted(lost)[:5]}"
    assert set(dead) == poison
