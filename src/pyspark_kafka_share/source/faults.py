"""The source task's test-only failure injection (option ``_faultInjection``): the kernel's
:class:`~pyspark_kafka_share._kafka.faults.Faults`, shared with the queue workers."""

from __future__ import annotations

from pyspark_kafka_share._kafka.faults import Faults

__all__ = ["Faults"]
