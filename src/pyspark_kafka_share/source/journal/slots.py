"""The slot format: what the journal's files hold, encoded and decoded. No I/O, no protocol.

A data slot is an Arrow IPC file whose schema metadata names the task attempt that wrote it
and what it holds (``content``):

* ``offsets`` (the default): what the poll acquired, as runs ``(topic, partition, offset,
  count, deliveryCount)`` in the poll's row order (``RUN_SCHEMA``: a run is ``count``
  consecutive offsets of one partition with one delivery count), plus the number of rows and
  a SHA-256 of the rows the poll yielded (:func:`rows_checksum`). A replay reads the records
  back from Kafka and proves them equal with the checksum. A 2,000-record poll of one
  partition is one run: under 1 kB, whatever the record size.
* ``records``: the poll's records themselves (the source's schema), which a replay yields as
  they are; for topics whose records may be gone before a replay.

An END marker is a small JSON document; a dedup entry is an Arrow IPC file of ``(topic,
partition, offset)`` keys (``KEY_SCHEMA``). A slot's first bytes tell data from END apart
(:func:`is_data`), so finding END reads only the head of the last slot.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pyarrow as pa
from pyarrow import ipc

from pyspark_kafka_share._kafka.arrow import KEY_SCHEMA
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share.source.journal.keys import SlotKeys, unique_offsets

__all__ = ["ARROW_MAGIC", "CONTENTS", "LOSS_PREFIX", "RUN_SCHEMA", "Content", "EndMarker",
           "OffsetSlot", "attempt_of", "data_slot", "dedup_entry", "is_data", "keys_of",
           "offsets_slot", "read_slot", "records_of", "rows_checksum", "runs_of"]

ARROW_MAGIC = b"ARROW1"  # the first bytes of an Arrow IPC file: a data slot or dedup entry

LOSS_PREFIX = "lost-"
"""A file ``lost-<attempt>`` beside a log's slots: ``{"records_lost": n}``, the records a
re-run after END skipped (``failOnDataLoss=false``), for the batch's metrics (slots are
numbers, so scans skip it)."""

Content = Literal["offsets", "records"]
CONTENTS: tuple[Content, ...] = ("offsets", "records")

RUN_SCHEMA = pa.schema([
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),  # the run's first offset
    pa.field("count", pa.int32()),
    pa.field("deliveryCount", pa.int32()),
])
"""An ``offsets`` slot's rows: runs of consecutive offsets, in the poll's row order."""


def _to_ipc(table: pa.Table | pa.RecordBatch, metadata: dict[str, str] | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    schema = table.schema.with_metadata(metadata) if metadata else table.schema
    if metadata:
        table = table.replace_schema_metadata(metadata)
    with ipc.new_file(sink, schema) as writer:
        if isinstance(table, pa.RecordBatch):
            writer.write_batch(table)
        else:
            writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


def data_slot(batch: pa.RecordBatch, attempt: int) -> bytes:
    """A ``records`` data slot of ``batch``, written by task attempt ``attempt``."""
    return _to_ipc(batch, {"attempt": str(attempt)})


def rows_checksum(batch: pa.RecordBatch | pa.Table) -> str:
    """SHA-256 (hex) of ``batch``'s rows: its column names and every Arrow buffer of every
    column, in order. Two batches built from equal records by ``messages_to_batch`` have equal
    buffers; a replay that read different bytes (another record at that offset, a key or a
    header changed) does not. 0.3 ms for a 2,000-record poll of 200-byte values."""
    digest = hashlib.sha256()
    digest.update(str(batch.num_rows).encode())
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        digest.update(name.encode())
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        for chunk in chunks:
            for buf in chunk.buffers():
                if buf is not None:
                    digest.update(memoryview(buf))
    return digest.hexdigest()


def runs_of(batch: pa.RecordBatch) -> pa.Table:
    """``batch``'s (topic, partition, offset, deliveryCount) as runs (``RUN_SCHEMA``), in row
    order: a run continues while the topic, partition and delivery count stay and the offset
    goes up by one. Vectorised: one pass of numpy over the columns."""
    n = batch.num_rows
    if n == 0:
        return RUN_SCHEMA.empty_table()
    offsets = np.asarray(batch.column("offset"), dtype=np.int64)
    parts = np.asarray(batch.column("partition"), dtype=np.int32)
    counts = np.asarray(batch.column("deliveryCount"), dtype=np.int32)
    topics = batch.column("topic").dictionary_encode()
    topic_ids = np.asarray(topics.indices, dtype=np.int64)
    breaks = np.ones(n, dtype=bool)
    breaks[1:] = (offsets[1:] != offsets[:-1] + 1) | (parts[1:] != parts[:-1]) | \
        (counts[1:] != counts[:-1]) | (topic_ids[1:] != topic_ids[:-1])
    starts = np.flatnonzero(breaks)
    lengths = np.diff(np.append(starts, n)).astype(np.int32)
    return pa.table({
        "topic": topics.dictionary.take(pa.array(topic_ids[starts])).cast(pa.string()),
        "partition": pa.array(parts[starts], pa.int32()),
        "offset": pa.array(offsets[starts], pa.int64()),
        "count": pa.array(lengths, pa.int32()),
        "deliveryCount": pa.array(counts[starts], pa.int32()),
    }, schema=RUN_SCHEMA)


def offsets_slot(batch: pa.RecordBatch, attempt: int) -> bytes:
    """An ``offsets`` data slot of ``batch`` (written by task attempt ``attempt``): its runs,
    row count and checksum."""
    return _to_ipc(runs_of(batch), {"attempt": str(attempt), "content": "offsets",
                                    "rows": str(batch.num_rows),
                                    "checksum": rows_checksum(batch)})


@dataclass(frozen=True)
class OffsetSlot:
    """An ``offsets`` data slot, read: its runs, row count and checksum."""

    runs: pa.Table
    rows: int
    checksum: str

    def keys(self) -> SlotKeys:
        """The offsets the runs cover, per topic-partition."""
        return SlotKeys(_expand(self.runs))

    def rows_in_order(self) -> tuple[list[TopicPartition], np.ndarray, np.ndarray, np.ndarray]:
        """Per row, in the poll's order: the index of its topic-partition in the list
        returned first, its offset and its delivery count (three arrays of ``rows``)."""
        tps: list[TopicPartition] = []
        index: dict[TopicPartition, int] = {}
        run_tp = []
        for t, p in zip(self.runs.column("topic").to_pylist(),
                        self.runs.column("partition").to_pylist(), strict=True):
            tp = TopicPartition(t, p)
            if tp not in index:
                index[tp] = len(tps)
                tps.append(tp)
            run_tp.append(index[tp])
        lengths = np.asarray(self.runs.column("count"), dtype=np.int64)
        first = np.asarray(self.runs.column("offset"), dtype=np.int64)
        run_of_row = np.repeat(np.arange(len(lengths)), lengths)
        starts = np.cumsum(lengths) - lengths
        offs = first[run_of_row] + (np.arange(int(lengths.sum())) - starts[run_of_row])
        counts = np.asarray(self.runs.column("deliveryCount"), dtype=np.int32)[run_of_row]
        return tps, np.asarray(run_tp, dtype=np.int64)[run_of_row], offs, counts


def _expand(runs: pa.Table) -> dict[TopicPartition, np.ndarray]:
    out: dict[TopicPartition, list[np.ndarray]] = {}
    for t, p, first, count in zip(runs.column("topic").to_pylist(),
                                  runs.column("partition").to_pylist(),
                                  runs.column("offset").to_pylist(),
                                  runs.column("count").to_pylist(), strict=True):
        out.setdefault(TopicPartition(t, p), []).append(
            np.arange(first, first + count, dtype=np.int64))
    return {tp: unique_offsets(np.concatenate(chunks)) for tp, chunks in out.items()}


def read_slot(data: bytes) -> pa.Table | OffsetSlot:
    """A data slot: the records of a ``records`` slot (as :func:`records_of`), or an
    :class:`OffsetSlot`."""
    table = ipc.open_file(pa.BufferReader(data)).read_all()
    meta = table.schema.metadata or {}
    if meta.get(b"content") == b"offsets":
        return OffsetSlot(table.replace_schema_metadata(None), int(meta[b"rows"]),
                          meta[b"checksum"].decode())
    return table.replace_schema_metadata(None)


def dedup_entry(keys: SlotKeys) -> bytes:
    """A dedup entry holding ``keys``, sorted."""
    return _to_ipc(pa.Table.from_pylist(
        [{"topic": t, "partition": p, "offset": o} for t, p, o in sorted(keys.keys())],
        schema=KEY_SCHEMA,
    ))


def is_data(head: bytes) -> bool:
    """Whether a slot starting with ``head`` (at least ``len(ARROW_MAGIC)`` bytes of it) holds
    records, not an END marker."""
    return head.startswith(ARROW_MAGIC)


def records_of(data: bytes) -> pa.Table:
    """The table of a data slot, without schema metadata (Spark wants the exact schema)."""
    return ipc.open_file(pa.BufferReader(data)).read_all().replace_schema_metadata(None)


def keys_of(data: bytes) -> SlotKeys:
    """The record identities in a data slot (of either content) or dedup entry (none in an END
    marker)."""
    if not is_data(data):
        return SlotKeys({})
    slot = read_slot(data)
    return slot.keys() if isinstance(slot, OffsetSlot) else SlotKeys.of_table(slot)


def attempt_of(data: bytes) -> int:
    """The task attempt that wrote data slot ``data`` (-1: not recorded)."""
    meta = ipc.open_file(pa.BufferReader(data)).schema.metadata or {}
    return int(meta.get(b"attempt", b"-1"))


@dataclass(frozen=True)
class EndMarker:
    """Closes a partition log; written by the attempt that finished it.

    ``min_offsets``: lowest offset per topic-partition among the records the log emits and
    those the ending attempt acquired (also released ones): AvailableNow's progress. Keyed
    ``"topic:partition"`` in the file.
    """

    attempt: int
    data_slots: int
    records: int
    acked_slots: tuple[int, ...] = ()
    stats: dict[str, int] = field(default_factory=dict)
    min_offsets: dict[TopicPartition, int] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return json.dumps({
            "end": True, "attempt": self.attempt, "data_slots": self.data_slots,
            "records": self.records, "acked_slots": list(self.acked_slots),
            "stats": self.stats,
            "min_offsets": {tp.key(): low for tp, low in self.min_offsets.items()},
        }).encode()

    @staticmethod
    def from_bytes(data: bytes) -> EndMarker:
        doc = json.loads(data)
        return EndMarker(attempt=int(doc["attempt"]), data_slots=int(doc["data_slots"]),
                         records=int(doc["records"]),
                         acked_slots=tuple(int(i) for i in doc.get("acked_slots", ())),
                         stats={k: int(v) for k, v in doc.get("stats", {}).items()},
                         min_offsets={TopicPartition.parse(k): int(v)
                                      for k, v in doc.get("min_offsets", {}).items()})

