"""A real Apache Kafka broker for development and tests (see :class:`LocalKafka`), a cluster
of them (:class:`LocalKafkaCluster`) and network faults (:class:`Toxiproxy`)."""

from __future__ import annotations

from pyspark_kafka_share.harness.broker import ENV_BOOTSTRAP, LocalKafka, ProducerRecord
from pyspark_kafka_share.harness.cluster import LocalKafkaCluster
from pyspark_kafka_share.harness.jars import (
    ENV_CACHE,
    ENV_KAFKA_VERSION,
    KAFKA_VERSION,
    KAFKA_VERSIONS,
    cache_dir,
    ensure_jars,
    kafka_version,
)
from pyspark_kafka_share.harness.s3 import LocalS3
from pyspark_kafka_share.harness.spark import LocalSparkCluster, local_spark
from pyspark_kafka_share.harness.toxiproxy import Toxiproxy

__all__ = [
    "ENV_BOOTSTRAP",
    "ENV_CACHE",
    "ENV_KAFKA_VERSION",
    "KAFKA_VERSION",
    "KAFKA_VERSIONS",
    "LocalKafka",
    "LocalKafkaCluster",
    "LocalS3",
    "LocalSparkCluster",
    "ProducerRecord",
    "Toxiproxy",
    "cache_dir",
    "ensure_jars",
    "kafka_version",
    "local_spark",
]
