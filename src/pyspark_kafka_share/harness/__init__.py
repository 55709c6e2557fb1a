"""A real Apache Kafka broker for development and tests (see :class:`LocalKafka`)."""

from __future__ import annotations

from pyspark_kafka_share.harness.broker import ENV_BOOTSTRAP, LocalKafka, ProducerRecord
from pyspark_kafka_share.harness.jars import ENV_CACHE, KAFKA_VERSION, cache_dir, ensure_jars
from pyspark_kafka_share.harness.s3 import LocalS3
from pyspark_kafka_share.harness.spark import LocalSparkCluster, local_spark

__all__ = [
    "ENV_BOOTSTRAP",
    "ENV_CACHE",
    "KAFKA_VERSION",
    "LocalKafka",
    "LocalS3",
    "LocalSparkCluster",
    "ProducerRecord",
    "cache_dir",
    "ensure_jars",
    "local_spark",
]
