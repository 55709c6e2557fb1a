"""Pure unit tests of the driver's side of a worker job (no broker, no Spark): the user's
``on_progress`` callback and the ``connection`` argument."""

from __future__ import annotations

import logging
import threading
import time
import types
from typing import Any

import pytest

from pyspark_kafka_share import ConnectionConfig
from pyspark_kafka_share.errors import OptionError
from pyspark_kafka_share.workers.api import WorkerJob, WorkerProgress
from pyspark_kafka_share.workers.config import WorkerConfig, WorkerSpec
from pyspark_kafka_share.workers.control import Endpoint
from tests.helpers import wait_for

BASE: dict[str, Any] = {"topics": "in", "group": "g", "bootstrap_servers": "b:9092"}


class _Job:
    """A Spark job that runs until released and returns no worker results."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def mapInArrow(self, task: Any, schema: str) -> _Job:
        return self

    def collect(self) -> list[Any]:
        self.release.wait(60)
        return []


class _Spark:
    """A classic session: a SparkContext with job groups, and ``range`` for the job."""

    def __init__(self) -> None:
        self.job = _Job()
        self.sparkContext = types.SimpleNamespace(
            setJobGroup=lambda *a, **k: None, cancelJobGroup=lambda *a: None)

    def range(self, *args: int) -> _Job:
        return self.job


class _Channel:
    """The driver's control channel with no worker reporting."""

    endpoint = Endpoint("127.0.0.1", 1, "token")
    stop_reason: str | None = None

    def request_stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason

    def reports(self) -> dict[tuple[int, int], dict[str, Any]]:
        return {}

    def latest(self) -> dict[int, dict[str, Any]]:
        return {}

    def close(self) -> None:
        return None


def test_on_progress_failures_are_logged_once_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    calls: list[WorkerProgress] = []

    def on_progress(progress: WorkerProgress) -> None:
        calls.append(progress)
        raise ValueError(f"bug in the callback, call {len(calls)}")

    config = WorkerConfig.create(**BASE, progress_interval_s=0.01)
    spec = WorkerSpec(config=config, lock_ms=30_000, delivery_limit=5)
    spark = _Spark()
    with caplog.at_level(logging.WARNING, logger="pyspark_kafka_share.workers.api"):
        job = WorkerJob(spark, spec, lambda record: None, server=_Channel(),
                        on_progress=on_progress)
        wait_for(job.progress, lambda p: p.on_progress_failures >= 3, what="3 failed calls")
        spark.job.release.set()
        summary = job.wait(30)
    assert summary.on_progress_failures >= 3 and calls[1].on_progress_failures >= 1
    assert f"on_progress raised {summary.on_progress_failures} time(s)" in str(summary)
    warnings = [r for r in caplog.records if "on_progress raised" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert warnings[0].exc_info is not None
    assert "bug in the callback, call 1" in str(warnings[0].exc_info[1])


def test_a_job_without_failures_says_nothing_of_on_progress() -> None:
    config = WorkerConfig.create(**BASE)
    spark = _Spark()
    job = WorkerJob(spark, WorkerSpec(config=config, lock_ms=30_000, delivery_limit=5),
                    lambda record: None, server=_Channel(), on_progress=None)
    spark.job.release.set()
    summary = job.wait(30)
    assert summary.on_progress_failures == 0 and "on_progress" not in str(summary)


def test_the_workers_take_a_connection_config() -> None:
    scram = ConnectionConfig(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                             username="alice", password="pw-secret")
    config = WorkerConfig.create(**BASE, connection=scram)
    consumer = dict(config.consumer_config)
    assert consumer["sasl.username"] == "alice"
    assert consumer["security.protocol"] == "SASL_PLAINTEXT"
    assert config.client.connection == scram  # the protocol client connects the same way
    assert config.producer_settings()["sasl.password"] == "pw-secret"
    same = WorkerConfig.create(**BASE, consumer_config=scram.client_settings())
    assert same.consumer_config == config.consumer_config


def test_a_connection_given_twice_or_of_a_wrong_type_is_refused() -> None:
    scram = ConnectionConfig(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                             username="alice", password="pw-secret")
    with pytest.raises(OptionError, match=r"consumer_config sets sasl.username.*once") as err:
        WorkerConfig.create(**BASE, connection=scram, consumer_config={"sasl.username": "bob"})
    assert "pw-secret" not in str(err.value)
    with pytest.raises(OptionError, match=r"connection.*give a ConnectionConfig"):
        WorkerConfig.create(**BASE, connection={"security.protocol": "SSL"})
    token = ConnectionConfig(security_protocol="SASL_PLAINTEXT", sasl_mechanism="OAUTHBEARER",
                             token_provider=lambda _: ("t", time.time() + 3600))
    assert WorkerConfig.create(**BASE, connection=token).token_provider is token.token_provider
