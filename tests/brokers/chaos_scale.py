"""``make chaos-scale``: the chaos schedule (tests/chaos) on the three-broker cluster, with the
cluster's own faults beside the source's, and how each cluster fault is done.

The schedule is a pure function of the seed, as the chaos test's (``CHAOS_SEED`` replays it):
:func:`scale_schedule` draws the kinds with :func:`make_schedule` from :data:`SCALE_KINDS`,
then each cluster fault's node (or partition) and duration from a generator of its own seeded
by the seed and the fault's index. The kinds:

- the source's: ``worker-sigkill``, ``worker-exit``, ``query-restart``, ``lock-expiry``
  (tests/chaos/chaos_schedule.py);
- ``node-crash``: SIGKILL one node, keep it down 1-6 s, restart it on its data;
- ``leader-move``: a controlled restart (SIGTERM, restart on its data) of a busy partition's
  leader, which hands its leaderships to the followers first;
- ``net-latency`` (500 ms each way), ``net-reset`` (connections reset 300 ms into their
  responses), ``net-blackhole`` (every byte swallowed both ways, past the 6 s session timeout
  at times), ``net-slow-drip``: on one node's client link (its Toxiproxy proxy), 3-15 s;
- ``executor-kill`` (with ``CHAOS_SPARK=cluster``: Spark is a standalone cluster of two
  workers, each with one executor JVM): SIGKILL one worker's executor; the master starts
  another and Spark runs its tasks again;
- ``rolling-upgrade`` (once, at the middle of the schedule, with ``CHAOS_UPGRADE_TO`` set,
  e.g. ``4.4.0`` while the cluster started on ``PYSPARK_KAFKA_SHARE_KAFKA_VERSION=4.2.2``):
  each node in turn stopped cleanly and started on the new release, the next only once every
  partition's replicas are all in sync again (as an operator does it); then
  ``share.version`` raised to 2 with Kafka's feature tool.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Mapping
from dataclasses import replace

from pyspark_kafka_share.harness import LocalKafkaCluster, Toxiproxy
from tests.brokers.network import TOXICS
from tests.chaos.chaos_schedule import (
    LOCK_EXPIRY,
    QUERY_RESTART,
    WORKER_EXIT,
    WORKER_SIGKILL,
    ChaosConfig,
    Fault,
    make_schedule,
)

__all__ = ["CLUSTER_KINDS", "EXECUTOR_KILL", "ROLLING_UPGRADE", "SCALE_KINDS", "cluster_fault",
           "describe", "scale_schedule", "spark_mode", "upgrade_target"]

NODE_CRASH = "node-crash"
LEADER_MOVE = "leader-move"
NETWORK_KINDS = tuple(TOXICS)  # net-latency, net-reset, net-blackhole, net-slow-drip
ROLLING_UPGRADE = "rolling-upgrade"
EXECUTOR_KILL = "executor-kill"
SPARK_WORKERS = 2  # the standalone cluster's workers (tests/fixtures/spark.py ``cluster``)
CLUSTER_KINDS = (NODE_CRASH, LEADER_MOVE, *NETWORK_KINDS)
SCALE_KINDS = (WORKER_SIGKILL, WORKER_EXIT, QUERY_RESTART, LOCK_EXPIRY, *CLUSTER_KINDS)


def spark_mode(env: Mapping[str, str] | None = None) -> str:
    """``$CHAOS_SPARK``: ``local`` (default, ``local[2, 4]``) or ``cluster`` (a standalone
    cluster; the schedule then has ``executor-kill`` faults)."""
    env = os.environ if env is None else env
    mode = env.get("CHAOS_SPARK") or "local"
    if mode not in ("local", "cluster"):
        raise ValueError(f"CHAOS_SPARK={mode!r}: use local or cluster")
    return mode


def upgrade_target(env: Mapping[str, str] | None = None) -> str | None:
    """The release of the schedule's rolling upgrade: ``$CHAOS_UPGRADE_TO`` (None: none)."""
    env = os.environ if env is None else env
    return env.get("CHAOS_UPGRADE_TO") or None


def scale_schedule(config: ChaosConfig, brokers: int = 3,
                   kinds: tuple[str, ...] = SCALE_KINDS,
                   upgrade_to: str | None = None) -> list[Fault]:
    """The run's faults: ``victim`` is a cluster fault's node id (``leader-move``: the
    partition whose leader moves) and ``down_s`` its duration. ``upgrade_to``: one
    ``rolling-upgrade`` more, at the time of the middle fault (index: after the others)."""
    out = _drawn(config, brokers, kinds)
    if upgrade_to and out:
        middle = out[len(out) // 2]
        out.insert(len(out) // 2, replace(middle, index=len(out), kind=ROLLING_UPGRADE,
                                          victim=0, down_s=0.0))
    return out


def _drawn(config: ChaosConfig, brokers: int, kinds: tuple[str, ...]) -> list[Fault]:
    out = []
    for fault in make_schedule(config, kinds):
        rng = random.Random(config.seed * 1_000 + fault.index)
        if fault.kind == EXECUTOR_KILL:
            out.append(replace(fault, victim=rng.randrange(SPARK_WORKERS)))
            continue
        if fault.kind not in CLUSTER_KINDS:
            out.append(fault)
            continue
        if fault.kind == LEADER_MOVE:
            out.append(replace(fault, victim=rng.randrange(config.topic_partitions)))
            continue
        low, high = (1.0, 6.0) if fault.kind == NODE_CRASH else (3.0, 15.0)
        out.append(replace(fault, victim=rng.randrange(1, brokers + 1),
                           down_s=round(rng.uniform(low, high), 1)))
    return out


def describe(fault: Fault) -> str:
    """A scheduled fault, for the report."""
    if fault.kind == ROLLING_UPGRADE:
        what = f"every node in turn onto {upgrade_target()}"
    elif fault.kind == EXECUTOR_KILL:
        what = f"SIGKILL Spark worker {fault.victim}'s executor"
    elif fault.kind == LEADER_MOVE:
        what = f"partition {fault.victim}'s leader restarted cleanly"
    elif fault.kind in CLUSTER_KINDS:
        what = f"node {fault.victim}, {fault.down_s:.1f}s"
    else:
        return fault.describe()
    return f"#{fault.index:<2} t={fault.at_s:6.1f}s {fault.kind:<14} {what}"


def cluster_fault(cluster: LocalKafkaCluster, toxiproxy: Toxiproxy | None, fault: Fault,
                  topic: str) -> str:
    """Do one cluster fault (a kind of :data:`CLUSTER_KINDS` or the rolling upgrade); what it
    did, for the report."""
    if fault.kind == ROLLING_UPGRADE:
        return rolling_upgrade(cluster, upgrade_target() or cluster.node(1).version)
    if fault.kind == NODE_CRASH:
        cluster.kill(fault.victim)
        time.sleep(fault.down_s)
        started = time.monotonic()
        cluster.restart(fault.victim)
        return (f"node {fault.victim} killed, down {fault.down_s:.1f}s, back after "
                f"{time.monotonic() - started:.1f}s")
    if fault.kind == LEADER_MOVE:
        leader = cluster.leader(topic, fault.victim)
        cluster.restart(leader)
        return (f"{topic}-{fault.victim}'s leader node {leader} restarted cleanly; the leader "
                f"is node {cluster.wait_for_leader(topic, fault.victim)} now")
    assert toxiproxy is not None, f"{fault.kind} needs the cluster behind Toxiproxy"
    proxy = cluster.proxy_name(fault.victim)
    through = toxiproxy.bytes_through(proxy)
    names = TOXICS[fault.kind](toxiproxy, proxy)
    time.sleep(fault.down_s)  # the fault itself
    through = toxiproxy.bytes_through(proxy) - through
    for name in names:
        toxiproxy.remove_toxic(proxy, name)
    return f"{fault.kind} on {proxy} for {fault.down_s:.1f}s: {through} bytes met it"


def rolling_upgrade(cluster: LocalKafkaCluster, version: str) -> str:
    """Each node in turn stopped cleanly and started on ``version``; the next only once every
    replica is in sync again. Then ``share.version=2`` (a feature of 4.4: the binaries alone
    change no feature level). What happened, for the report."""
    steps = []
    for node_id in cluster.node_ids:
        was = cluster.node(node_id).version
        began = time.monotonic()
        cluster.restart(node_id, version=version)
        back = time.monotonic() - began
        steps.append(f"node {node_id} {was}->{version} back in {back:.0f}s, all replicas in "
                     f"sync {wait_in_sync(cluster):.0f}s later")
    raised = cluster.run_tool("FeatureCommand", "--bootstrap-server", cluster.bootstrap_servers,
                              "upgrade", "--feature", "share.version=2")
    return "; ".join([*steps, raised.stdout.strip().replace("\n", " ")])


def wait_in_sync(cluster: LocalKafkaCluster, timeout_s: float = 300.0) -> float:
    """Until every partition of every topic (the internal ones too) has all its replicas in
    sync; seconds waited."""
    began = time.monotonic()
    behind: list[str] = []
    while time.monotonic() - began < timeout_s:
        try:
            topics = cluster.admin().list_topics(timeout=10).topics
            behind = [f"{name}-{p}" for name, t in topics.items()
                      for p, part in t.partitions.items() if len(part.isrs) < len(part.replicas)]
        except Exception as exc:  # noqa: BLE001 - a node still starting: ask again
            behind = [repr(exc)]
        if not behind:
            return time.monotonic() - began
        time.sleep(1.0)
    raise AssertionError(f"replicas not in sync after {timeout_s:.0f}s: {behind[:10]}")
