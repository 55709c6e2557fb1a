"""Conversion of share-consumer messages into ``pyarrow.RecordBatch``es.

The Arrow schema matches the Spark schema field for field (names, types, nullability), which the
Python Data Source API requires of yielded record batches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pyspark_kafka_share._kafka.partition import TopicPartition

__all__ = [
    "KEY_SCHEMA",
    "arrow_schema",
    "messages_to_batch",
    "partitions_of",
    "single_topic",
    "spark_schema_ddl",
]

_HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
_TS = pa.timestamp("us", tz="UTC")

KEY_SCHEMA = pa.schema([
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
])
"""The record identity kept for de-duplication."""


def spark_schema_ddl(include_headers: bool) -> str:
    """The source's Spark schema: that of Spark's ``kafka`` source plus ``deliveryCount``."""
    cols = ["key BINARY", "value BINARY", "topic STRING", "partition INT", "offset BIGINT",
            "timestamp TIMESTAMP", "timestampType INT"]
    if include_headers:
        cols.append("headers ARRAY<STRUCT<key: STRING, value: BINARY>>")
    cols.append("deliveryCount INT")
    return ", ".join(cols)


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", _TS),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", _HEADERS))
    fields.append(pa.field("deliveryCount", pa.int32()))
    return pa.schema(fields)


def messages_to_batch(messages: Sequence[Any], include_headers: bool) -> pa.RecordBatch:
    """Columns of ``messages`` (confluent-kafka ``Message``s without errors) as one batch."""
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    topics: list[str] = []
    partitions: list[int] = []
    offsets: list[int] = []
    stamps: list[int | None] = []
    stamp_types: list[int] = []
    counts: list[int] = []
    headers: list[list[tuple[str, bytes | None]] | None] = []
    for m in messages:
        keys.append(m.key())
        values.append(m.value())
        topics.append(m.topic())
        partitions.append(m.partition())
        offsets.append(m.offset())
        ts_type, ts = m.timestamp()
        stamps.append(ts * 1000 if ts_type else None)
        stamp_types.append(ts_type - 1 if ts_type else -1)
        counts.append(m.delivery_count())
        if include_headers:
            headers.append(m.headers())
    # confluent-kafka: TIMESTAMP_NOT_AVAILABLE=0, CREATE_TIME=1, LOG_APPEND_TIME=2; Spark's
    # kafka source reports Kafka's TimestampType ids: CREATE_TIME=0, LOG_APPEND_TIME=1.
    arrays: list[pa.Array] = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array(topics, pa.string()),
        pa.array(partitions, pa.int32()),
        pa.array(offsets, pa.int64()),
        pa.array(stamps, _TS),
        pa.array(stamp_types, pa.int32()),
    ]
    if include_headers:
        arrays.append(pa.array(
            [None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers],
            _HEADERS,
        ))
    arrays.append(pa.array(counts, pa.int32()))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema(include_headers))


def partitions_of(table: pa.Table | pa.RecordBatch) -> set[TopicPartition]:
    """The distinct partitions of ``table``, without a per-row Python loop."""
    topic = single_topic(table)
    if topic is not None:
        return {TopicPartition(topic, p)
                for p in pc.unique(table.column("partition")).to_pylist()}
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    pairs = table.group_by(["topic", "partition"]).aggregate([])
    return {TopicPartition(t, p) for t, p in zip(pairs.column("topic").to_pylist(),
                                                  pairs.column("partition").to_pylist(),
                                                  strict=True)}


def single_topic(table: pa.Table | pa.RecordBatch) -> str | None:
    """The one topic of ``table`` (the common case, which then needs no group-by: measured
    3x cheaper on a 2,000-row poll), or None when it has none or several."""
    topics = pc.unique(table.column("topic"))
    return str(topics[0].as_py()) if len(topics) == 1 else None
