"""Queue workers: user code decides each record's outcome, on Spark executors.

Driver: ``api`` (:func:`run_workers`, :func:`start_workers`, :class:`WorkerJob`), ``config``
(the one typed :class:`WorkerConfig`, validated once) and the server side of ``control``.
Executor: ``loop`` (one long-lived share consumer per Spark task) and the client side of
``control``. Both: ``outcome`` (:class:`Outcome`, :class:`Result`, :class:`Record`: what the
user's function is given and returns), ``retry`` (:class:`Backoff`) and ``decode``
(:class:`SchemaRegistryDeserializer`). Guarantees and limits: ``docs/workers.md``.
"""

from __future__ import annotations

from pyspark_kafka_share.workers.api import (
    DLQ_HEADERS,
    Outcome,
    Record,
    Result,
    WorkerJob,
    WorkerProgress,
    WorkerSummary,
    run_workers,
    start_workers,
)
from pyspark_kafka_share.workers.decode import SchemaRegistryDeserializer
from pyspark_kafka_share.workers.retry import Backoff

__all__ = [
    "DLQ_HEADERS",
    "Backoff",
    "Outcome",
    "Record",
    "Result",
    "SchemaRegistryDeserializer",
    "WorkerJob",
    "WorkerProgress",
    "WorkerSummary",
    "run_workers",
    "start_workers",
]
