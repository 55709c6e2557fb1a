"""Shared fixtures: one real Kafka broker and one local SparkSession per test session.

- ``kafka``: the :class:`LocalKafka` broker (or ``$PYSPARK_KAFKA_SHARE_BOOTSTRAP``).
- ``topic_factory`` / ``topic``: unique topic names per test.
- ``group``: a unique share-group name, with ``share.auto.offset.reset=earliest``.
- ``share_consumer``: a factory of explicit-mode ``ShareConsumer``s, closed at teardown.
- ``spark``: a ``local[2]`` SparkSession whose Python workers run this interpreter, so they
  import the installed package.

Tests using ``kafka`` are marked ``broker`` and tests using ``spark`` are marked ``spark``
automatically; ``make unit`` runs the rest.
"""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pyspark_kafka_share.harness import LocalKafka, local_spark


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & {"kafka", "topic", "topic_factory", "group", "share_consumer"}:
            item.add_marker(pytest.mark.broker)
        if "spark" in names:
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def kafka() -> Iterator[LocalKafka]:
    with LocalKafka() as broker:
        yield broker


def _slug(request: pytest.FixtureRequest) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", request.node.name)[:40].strip("-")


@pytest.fixture
def topic_factory(kafka: LocalKafka, request: pytest.FixtureRequest) -> Callable[..., str]:
    def make(partitions: int = 1) -> str:
        name = f"t-{_slug(request)}-{uuid.uuid4().hex[:8]}"
        return kafka.create_topic(name, partitions)

    return make


@pytest.fixture
def topic(topic_factory: Callable[..., str]) -> str:
    return topic_factory(1)


@pytest.fixture
def group(kafka: LocalKafka, request: pytest.FixtureRequest) -> str:
    name = f"g-{_slug(request)}-{uuid.uuid4().hex[:8]}"
    kafka.set_group_config(name, "share.auto.offset.reset", "earliest")
    return name


@pytest.fixture
def share_consumer(kafka: LocalKafka) -> Iterator[Callable[..., Any]]:
    from confluent_kafka import ShareConsumer

    made: list[Any] = []

    def make(group: str, topics: list[str], **conf: str) -> Any:
        config = {"bootstrap.servers": kafka.bootstrap_servers, "group.id": group,
                  "share.acknowledgement.mode": "explicit", **conf}
        consumer = ShareConsumer(config)
        consumer.subscribe(topics)
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        with contextlib.suppress(Exception):
            consumer.close()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    # local[2, 4]: 2 task slots, 4 attempts per task; Python workers run this interpreter.
    session = local_spark("local[2, 4]", "pyspark-kafka-share-tests")
    yield session
    session.stop()
