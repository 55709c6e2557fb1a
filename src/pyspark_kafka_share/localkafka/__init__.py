"""A real Apache Kafka broker for development and tests (see :class:`LocalKafka`)."""

from __future__ import annotations

from pyspark_kafka_share.localkafka.broker import (
    ENV_BOOTSTRAP,
    ENV_CACHE,
    KAFKA_VERSION,
    LocalKafka,
    ProducerRecord,
    cache_dir,
    ensure_jars,
)

__all__ = [
    "ENV_BOOTSTRAP",
    "ENV_CACHE",
    "KAFKA_VERSION",
    "LocalKafka",
    "ProducerRecord",
    "cache_dir",
    "ensure_jars",
]
