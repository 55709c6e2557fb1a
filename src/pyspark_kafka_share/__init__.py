"""pyspark-kafka-share: Apache Kafka share groups (KIP-932, queues) for PySpark.

- :mod:`pyspark_kafka_share.localkafka`: a real local Kafka broker for development and tests.
"""

from __future__ import annotations

from pyspark_kafka_share.errors import (
    BrokerError,
    JournalError,
    KafkaShareError,
    LocalKafkaError,
    OptionError,
)

__version__ = "0.1.0"

__all__ = [
    "BrokerError",
    "JournalError",
    "KafkaShareError",
    "LocalKafkaError",
    "OptionError",
    "__version__",
]
