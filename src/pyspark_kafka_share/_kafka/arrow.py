"""Conversion of share-consumer messages into ``pyarrow.RecordBatch``es.

The Arrow schema matches the Spark schema field for field (names, types, nullability), which the
Python Data Source API requires of yielded record batches. Two ways in: confluent-kafka
``Message``s (or anything read like them), one object per record (:func:`messages_to_batch`);
or a fetch's decoded columns (``protocol.records.Columns``), which the native client turns
into the batch directly (:func:`columns_to_batch`) and hands over as a :class:`ColumnarPoll`,
whose batch :func:`messages_to_batch` then returns as it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.protocol.records import Columns

__all__ = [
    "KEY_SCHEMA",
    "ColumnarPoll",
    "arrow_schema",
    "columns_to_batch",
    "join_polls",
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


class ColumnarPoll(Sequence[Any]):
    """A poll whose records arrived as Arrow columns (the native client's, for the source):
    ``arrow_batch`` in the source's schema, and the offsets of each partition. Read as a
    sequence it gives message objects, made on demand (the rare paths: duplicates, a passed
    deadline); the common path never makes one."""

    arrow_batch: pa.RecordBatch
    parts: Mapping[TopicPartition, npt.NDArray[np.int64]]

    def offsets_by_partition(self) -> Mapping[TopicPartition, npt.NDArray[np.int64]]:
        """The poll's offsets of each topic-partition."""
        return self.parts

    def __len__(self) -> int:
        return int(self.arrow_batch.num_rows)


def offsets_of(pieces: Iterable[tuple[TopicPartition, npt.NDArray[np.int64]]]
               ) -> dict[TopicPartition, npt.NDArray[np.int64]]:
    """The offsets of each topic-partition, its ``pieces`` joined in order."""
    parts: dict[TopicPartition, list[npt.NDArray[np.int64]]] = {}
    for tp, offsets in pieces:
        parts.setdefault(tp, []).append(offsets)
    return {tp: np.concatenate(arrays) for tp, arrays in parts.items()}


class JoinedPoll(ColumnarPoll):
    """Several :class:`ColumnarPoll`s held as one (a journal slot of several fetches): their
    batches as one, in poll order, and their offsets per partition; read as a sequence, their
    messages in the same order (each with its own poll's lock start)."""

    def __init__(self, polls: Sequence[ColumnarPoll]) -> None:
        self.polls = list(polls)
        # As a poll of several partitions is made one batch: the buffers messages_to_batch
        # gives the same records, so an offsets slot's checksum holds on replay.
        self.arrow_batch = pa.Table.from_batches([p.arrow_batch for p in self.polls]) \
            .combine_chunks().to_batches(max_chunksize=None)[0]
        self.parts = offsets_of(piece for p in self.polls
                                for piece in p.offsets_by_partition().items())
        self._messages: list[Any] | None = None

    def __getitem__(self, i: Any) -> Any:
        if self._messages is None:  # made once: iterating indexes it record by record
            self._messages = [m for p in self.polls for m in p]
        return self._messages[i]


def join_polls(polls: Sequence[Sequence[Any]]) -> Sequence[Any]:
    """``polls`` (non-empty) as one: itself if one, a :class:`JoinedPoll` of columnar polls,
    else their messages in order."""
    if len(polls) == 1:
        return polls[0]
    if all(isinstance(p, ColumnarPoll) for p in polls):
        return JoinedPoll([p for p in polls if isinstance(p, ColumnarPoll)])
    return [m for p in polls for m in p]


def messages_to_batch(messages: Sequence[Any], include_headers: bool) -> pa.RecordBatch:
    """Columns of ``messages`` (confluent-kafka ``Message``s without errors) as one batch; a
    :class:`ColumnarPoll`'s own batch (decoded that way, ``include_headers`` as asked)."""
    if isinstance(messages, ColumnarPoll):
        return messages.arrow_batch
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


def columns_to_batch(cols: Columns, rows: npt.NDArray[np.intp], topic: str, partition: int,
                     *, log_append: npt.NDArray[np.bool_], counts: npt.NDArray[np.int32],
                     include_headers: bool) -> pa.RecordBatch:
    """Rows ``rows`` of a fetch's decoded ``cols`` (one topic-partition's) as one batch of the
    source's schema: ``log_append``: per row of ``cols``, whether its timestamp is the broker's
    LogAppendTime; ``counts``: per row, its delivery count. The same values
    :func:`messages_to_batch` makes of those records read as messages, without an object per
    record (but the keys' and values' bytes)."""
    n = len(rows)
    picks = None if n == len(cols) else rows.tolist()

    def picked(values: list[Any], kind: pa.DataType) -> pa.Array:
        # Built from the values as messages_to_batch builds them (not Array.take, which adds a
        # validity bitmap): the same buffers, so the journal's rows checksum of an offsets
        # slot matches its replay's.
        return pa.array(values if picks is None else [values[i] for i in picks], kind)

    offsets = np.frombuffer(cols.offsets, dtype=np.int64)[rows]
    stamps = np.frombuffer(cols.timestamps, dtype=np.int64)[rows]
    missing = stamps < 0
    stamp_types = np.where(missing, -1, log_append[rows].astype(np.int32)).astype(np.int32)
    arrays: list[pa.Array] = [
        picked(cols.keys, pa.binary()),
        picked(cols.values, pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.array(np.full(n, partition, dtype=np.int32)),
        pa.array(offsets),
        pa.array(stamps * 1000, _TS, mask=missing if missing.any() else None),
        pa.array(stamp_types),
    ]
    if include_headers:
        arrays.append(pa.array(
            [[{"key": k, "value": v} for k, v in cols.headers[i]] or None for i in rows.tolist()],
            _HEADERS))
    arrays.append(pa.array(counts[rows].astype(np.int32)))
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
