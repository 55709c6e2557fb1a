"""The ``kafka-share`` Structured Streaming source.

Driver: ``datasource`` (the data source and stream reader: options, offsets, planning, commit),
``options`` (the one typed config, parsed once) and ``offset`` (the batch plan Spark logs).
Executor: ``task`` (what one task of one micro-batch does with its polls) and ``poller`` (polling
within the task's budget). Both: ``spec`` (the ``TaskSpec`` a task receives) and ``journal/``.

PySpark is imported only when :class:`KafkaShareDataSource` is used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KafkaShareDataSource", "KafkaShareStreamReader"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from pyspark_kafka_share.source import datasource

        return getattr(datasource, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
