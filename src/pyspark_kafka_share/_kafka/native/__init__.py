"""A share consumer of the project's own, on the protocol client (:mod:`.consumer`)."""

from __future__ import annotations

from pyspark_kafka_share._kafka.native.consumer import (
    NativeConsumerConfig,
    NativeShareConsumer,
    ShareRecord,
)

__all__ = ["NativeConsumerConfig", "NativeShareConsumer", "ShareRecord"]
