"""The cluster tier: the source and the queue workers on a real Spark standalone cluster.

- ``cluster``: a :class:`LocalSparkCluster` (one master, two workers with one core each on
  127.0.0.1 and 127.0.0.2, one executor JVM per worker) for the test session.
- ``cluster_spark``: a SparkSession on it, with speculative execution on and tuned to launch
  copies of a task that is clearly slower than the others.
- ``journal``: where the source's journal lives, a parameter: a local directory (every
  executor of this one-machine cluster sees it) and ``s3://`` on a :class:`LocalS3`.
- ``evidence``: lines (speculative attempts, killed executors) printed at once and again in the
  terminal summary, so that CI output shows what the tier did.

The ``kafka`` broker fixture comes from ``tests/conftest.py``. A process holds one
SparkContext, so these tests run in a pytest process of their own (``make test-cluster``); in a
run that also collects other tests they are skipped.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from helpers import TierReport, tier_hooks
from pyspark_kafka_share.harness import LocalKafka, LocalS3, LocalSparkCluster

SPECULATION = {
    "spark.speculation": "true",
    "spark.speculation.interval": "200ms",
    # Once half of a stage's tasks are done, a task running 1.5x their median (and at
    # least 2 s) gets a copy on another executor (another host: see LocalSparkCluster).
    "spark.speculation.quantile": "0.5",
    "spark.speculation.multiplier": "1.5",
    "spark.speculation.minTaskRuntime": "2s",
}

_EVIDENCE = TierReport("cluster tier: what really happened")


pytest_collection_modifyitems, pytest_terminal_summary = tier_hooks(
    "cluster", "the cluster tier needs a pytest process of its own "
    "(one SparkContext per process): make test-cluster", _EVIDENCE)


@pytest.fixture
def evidence(request: pytest.FixtureRequest) -> Any:
    """``evidence("...")`` prints a line now and in the terminal summary."""
    def note(line: str) -> None:
        _EVIDENCE.note(f"[{request.node.name}] {line}")

    return note


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalSparkCluster]:
    started = time.monotonic()
    with LocalSparkCluster(workers=2, cores_per_worker=1) as c:
        print(f"\nSpark standalone cluster up in {time.monotonic() - started:.1f}s: "
              f"{c.master_url}, workers on {', '.join(c.hosts)}", flush=True)
        yield c


@pytest.fixture(scope="session")
def cluster_spark(cluster: LocalSparkCluster, kafka: LocalKafka) -> Iterator[Any]:
    # kafka first: the broker is started before (and stopped after) the executors using it.
    started = time.monotonic()
    spark = cluster.session("pyspark-kafka-share-cluster-tests", conf={
        **SPECULATION,
        # An executor lost to SIGKILL is a task failure; keep Spark's default of 4 attempts.
        "spark.task.maxFailures": "4",
    })
    executors = [(e.worker, e.executor_id, e.host, e.pid) for e in cluster.executors()]
    print(f"SparkSession {spark.sparkContext.applicationId} up in "
          f"{time.monotonic() - started:.1f}s; executors (worker, id, host, pid): {executors}",
          flush=True)
    yield spark
    spark.stop()


@dataclass(frozen=True)
class Journal:
    """Where a query's journal lives: ``journalPath`` and the reader options it needs."""

    kind: str
    url: str
    options: dict[str, str] = field(default_factory=dict)


# Journal kinds the tier runs against: a local directory (every executor of this one-machine
# cluster sees it) and s3:// on LocalS3 (moto on loopback), as clusters keep it in production.
JOURNAL_KINDS = ["local", "s3"]


@pytest.fixture(scope="session")
def s3() -> Iterator[LocalS3]:
    with LocalS3() as server:
        server.create_bucket("journals")
        yield server


@pytest.fixture(params=JOURNAL_KINDS)
def journal(request: pytest.FixtureRequest, tmp_path: Any) -> Journal:
    if request.param == "local":
        return Journal("local", str(tmp_path / "journal"))
    if request.param == "s3":
        server: LocalS3 = request.getfixturevalue("s3")
        return Journal("s3", f"s3://journals/j-{uuid.uuid4().hex[:12]}",
                       server.journal_options())
    raise AssertionError(f"unknown journal kind {request.param!r}")
