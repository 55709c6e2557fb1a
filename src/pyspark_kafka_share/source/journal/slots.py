"""The slot format: what the journal's files hold, encoded and decoded. No I/O, no protocol.

A data slot is an Arrow IPC file of one poll's records whose schema metadata names the task
attempt that wrote it; an END marker is a small JSON document; a dedup entry is an Arrow IPC
file of ``(topic, partition, offset)`` keys (``KEY_SCHEMA``). A slot's first bytes tell the
two kinds apart (:func:`is_data`), so finding END reads only the head of the last slot.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pyarrow as pa
from pyarrow import ipc

from pyspark_kafka_share._kafka.arrow import KEY_SCHEMA
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share.source.journal.keys import SlotKeys

__all__ = ["ARROW_MAGIC", "EndMarker", "attempt_of", "data_slot", "dedup_entry", "is_data",
           "keys_of", "records_of"]

ARROW_MAGIC = b"ARROW1"  # the first bytes of an Arrow IPC file: a data slot or dedup entry


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
    """A data slot of ``batch``, written by task attempt ``attempt``."""
    return _to_ipc(batch, {"attempt": str(attempt)})


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
    """The record identities in a data slot or dedup entry (none in an END marker)."""
    return SlotKeys.of_table(records_of(data)) if is_data(data) else SlotKeys({})


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

