"""The chaos test's configuration and its fault schedule, a pure function of the seed.

Everything random about a chaos run is decided here, before it starts: which faults, in which
order, when, and their parameters (how long the broker stays down, which task sleeps past its
lock, ...). The same seed and sizes give the same schedule, so a failing seed reruns the same
faults (``CHAOS_SEED=<seed> make chaos``). What the faults then hit (which Python worker is
busy when a SIGKILL lands, which batch is running) depends on timing and is printed as it
happens.

Environment: ``CHAOS_SEED`` (default: random), ``CHAOS_RECORDS`` (default 15,000),
``CHAOS_FAULTS`` (default 10), ``CHAOS_INTERVAL_S`` (mean seconds between faults, default 10),
``CHAOS_CLIENT`` (the share consumer of the source and the queue workers: ``librdkafka`` or
``native``; unset, each chaos test runs once per client, :func:`chaos_clients`, and ``make
chaos-scale``'s query alternates them from start to start; the schedule does not depend on it).
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark_kafka_share.workers.config import CLIENTS, ShareClient

__all__ = ["KINDS", "ChaosConfig", "Fault", "chaos_clients", "make_schedule", "worker_client"]

WORKER_SIGKILL = "worker-sigkill"
"""SIGKILL (kill -9, from outside) a PySpark Python worker while a read stage is running."""
WORKER_EXIT = "worker-exit"
"""Restart the query with a ``kill-*`` fault point: the worker dies (``os._exit``) exactly
after a journal publish (before its ACCEPT) or after END (before rows are yielded)."""
BROKER_CRASH = "broker-crash"
"""SIGKILL the broker JVM (no controlled shutdown), keep it down a while, restart it."""
QUERY_RESTART = "query-restart"
"""Stop the streaming query wherever it is and start it again from its checkpoint."""
LOCK_EXPIRY = "lock-expiry"
"""Restart the query with a ``sleep-before-publish`` longer than the group's acquisition
lock: the broker takes the records back while the task still holds them."""

def worker_client(env: Mapping[str, str] | None = None) -> ShareClient:
    """The client ``$CHAOS_CLIENT`` names (``librdkafka`` or ``native``; unset:
    ``librdkafka``)."""
    env = os.environ if env is None else env
    wanted = env.get("CHAOS_CLIENT") or CLIENTS[0]
    for client in CLIENTS:
        if client == wanted:
            return client
    raise ValueError(f"CHAOS_CLIENT={wanted!r}: use one of {', '.join(CLIENTS)}")


def chaos_clients(env: Mapping[str, str] | None = None) -> tuple[ShareClient, ...]:
    """The share clients ``make chaos`` runs each chaos test with (the source's ``client``
    option, the workers' ``client``): ``$CHAOS_CLIENT`` alone when it is set, every client
    otherwise (CI's ``make chaos``: issues 38 and 39 ask for the chaos runs on both)."""
    env = os.environ if env is None else env
    return (worker_client(env),) if env.get("CHAOS_CLIENT") else CLIENTS


KINDS = (WORKER_SIGKILL, WORKER_EXIT, BROKER_CRASH, QUERY_RESTART, LOCK_EXPIRY)
KILL_POINTS = ("kill-after-publish", "kill-after-end")


@dataclass(frozen=True)
class ChaosConfig:
    """The size and shape of one chaos run."""

    seed: int
    records: int = 15_000
    faults: int = 10
    interval_s: float = 10.0  # mean time between two faults
    warmup_s: float = 15.0  # before the first fault: the query's first batches run
    topic_partitions: int = 4
    tasks: int = 2  # numPartitions: = the local[2] task slots
    lock_ms: int = 4_000  # the group's share.record.lock.duration.ms
    delivery_limit: int = 10  # the group's share.delivery.count.limit (the broker's maximum)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ChaosConfig:
        env = os.environ if env is None else env
        seed = int(env["CHAOS_SEED"]) if env.get("CHAOS_SEED") else random.SystemRandom(
        ).randrange(1, 2**31)
        config = cls(seed=seed, records=int(env.get("CHAOS_RECORDS") or cls.records),
                     faults=int(env.get("CHAOS_FAULTS") or cls.faults),
                     interval_s=float(env.get("CHAOS_INTERVAL_S") or cls.interval_s))
        if config.records < 1 or config.faults < 0 or config.interval_s <= 0:
            raise ValueError(f"bad chaos size: {config}")
        return config

    @property
    def chaos_s(self) -> float:
        """How long the schedule injects faults (the last fault falls before its end)."""
        return self.warmup_s + self.faults * self.interval_s

    @property
    def rate(self) -> float:
        """Records per second: ``records`` over ``chaos_s``. When faults take longer than
        planned, production goes on at this rate until the last one is done."""
        return self.records / self.chaos_s

    def budget_s(self) -> float:
        """A generous bound on the whole run (setup, chaos, drain), for the test's timeout:
        each fault may wait up to 120 s for the query to make progress first."""
        return 600 + self.chaos_s + self.faults * 60 + self.records / 100


@dataclass(frozen=True)
class Fault:
    """One scheduled fault: ``kind`` at ``at_s`` seconds after the chaos phase starts.

    A fault starts at ``at_s`` or, if the previous one is still running (a broker restart
    takes seconds), as soon as it ends. Only the fields of its kind are meaningful.
    """

    index: int
    at_s: float
    kind: str
    down_s: float = 0.0  # broker-crash: seconds the broker stays dead
    pause_s: float = 0.0  # query-restart: seconds between stop and start
    point: str = ""  # worker-exit: the kill-* fault point
    part: int = 0  # worker-exit, lock-expiry: the task (input partition) hit
    victim: int = 0  # worker-sigkill: which busy worker, as an index into them (mod count)

    def describe(self) -> str:
        detail = {
            WORKER_SIGKILL: f"SIGKILL busy Python worker #{self.victim}",
            WORKER_EXIT: f"restart with {self.point} on task {self.part}",
            BROKER_CRASH: f"SIGKILL broker, down {self.down_s:.1f}s, restart",
            QUERY_RESTART: f"stop query, {self.pause_s:.1f}s, start from checkpoint",
            LOCK_EXPIRY: f"restart with task {self.part} sleeping past its lock",
        }[self.kind]
        return f"#{self.index:<2} t={self.at_s:6.1f}s {self.kind:<14} {detail}"


def make_schedule(config: ChaosConfig, kinds_used: Sequence[str] = KINDS) -> list[Fault]:
    """The faults of a run, in time order; every kind of ``kinds_used`` at least once when
    there are enough (the brokers tier's chaos-scale passes its own kinds; their parameters
    beyond ``at_s`` are its own too)."""
    rng = random.Random(config.seed)
    n = config.faults
    if n >= len(kinds_used):
        kinds = list(kinds_used) + [rng.choice(kinds_used) for _ in range(n - len(kinds_used))]
        rng.shuffle(kinds)
    else:
        kinds = rng.sample(list(kinds_used), n)
    faults = []
    for i, kind in enumerate(kinds):
        # One fault per interval, at a random moment in its first 60 %.
        at = config.warmup_s + i * config.interval_s + rng.uniform(0, 0.6 * config.interval_s)
        faults.append(Fault(
            index=i, at_s=round(at, 1), kind=kind,
            down_s=round(rng.uniform(1.0, 6.0), 1) if kind == BROKER_CRASH else 0.0,
            pause_s=round(rng.uniform(0.0, 3.0), 1) if kind == QUERY_RESTART else 0.0,
            point=rng.choice(KILL_POINTS) if kind == WORKER_EXIT else "",
            part=rng.randrange(config.tasks) if kind in (WORKER_EXIT, LOCK_EXPIRY) else 0,
            victim=rng.randrange(4) if kind == WORKER_SIGKILL else 0,
        ))
    return faults
