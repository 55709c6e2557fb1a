"""pyspark-kafka-share: Apache Kafka share groups (KIP-932, queues) for PySpark.

- ``spark.readStream.format("kafka-share")``: a Structured Streaming source that ACCEPTs a
  record only after it is durable in a journal, so micro-batches replay exactly.
- :mod:`pyspark_kafka_share.workers`: queue workers on Spark executors; user code decides each
  record's outcome (ACCEPT, RELEASE, REJECT, dead-letter topic).
- :mod:`pyspark_kafka_share.admin`: share-group admin (describe, lag, reset).
- :class:`ConnectionConfig` (:mod:`pyspark_kafka_share.connection`): how the admin and the
  workers reach a secured cluster (TLS, SASL), typed and validated.
- :func:`progress`: the source's lag and last-batch counters from a query's progress, the same
  on every Spark line.
- :mod:`pyspark_kafka_share.harness`: a real local Kafka broker for development and tests.

Importing this package is cheap: PySpark is imported only when ``DefaultSource`` is used.
"""

from __future__ import annotations

from typing import Any

from pyspark_kafka_share.connection import ConnectionConfig
from pyspark_kafka_share.errors import (
    BrokerError,
    JournalError,
    KafkaShareError,
    LocalKafkaError,
    OptionError,
)
from pyspark_kafka_share.query_progress import SourceProgress, progress

__version__ = "0.1.0"

__all__ = [
    "BrokerError",
    "ConnectionConfig",
    "DefaultSource",
    "JournalError",
    "KafkaShareDataSource",
    "KafkaShareError",
    "LocalKafkaError",
    "OptionError",
    "SourceProgress",
    "__version__",
    "progress",
]


def __getattr__(name: str) -> Any:
    # PySpark registers ``pyspark_*`` modules' ``DefaultSource`` automatically; resolve it lazily
    # so that importing the package (CLI, harness) does not import PySpark.
    if name in ("DefaultSource", "KafkaShareDataSource"):
        from pyspark_kafka_share.source.datasource import KafkaShareDataSource

        return KafkaShareDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
