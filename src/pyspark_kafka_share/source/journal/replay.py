"""Yielding data slots a task did not poll itself: ``records`` slots as written, ``offsets``
slots read back from Kafka (``_kafka.replay``) and proved equal to what the first attempt
yielded by their checksum.

A :class:`SlotReader` reads every ``offsets`` slot it is asked for in one call, so each
partition's range is read from Kafka once for all the slots of a task (a retry, a speculative
copy, a restart from the checkpoint, or a concurrent attempt's slots between two of one's own).
Records gone from Kafka, or different (a re-created topic), fail the task with
:class:`DataLossError` naming the batch, the topic-partition, the offsets, the cause and the
fix; with ``failOnDataLoss=false`` they are skipped, counted (``records_lost``) and logged once
per batch.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pyspark_kafka_share._kafka.arrow import messages_to_batch
from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share._kafka.replay import PartitionRead, read_offsets
from pyspark_kafka_share._kafka.settings import ClientSettings
from pyspark_kafka_share.errors import DataLossError
from pyspark_kafka_share.source.journal.fencing import PartLog
from pyspark_kafka_share.source.journal.slots import LOSS_PREFIX, OffsetSlot, rows_checksum

__all__ = ["REPLAY_CHUNK_ROWS", "ReplaySettings", "SlotReader",
           "describe_offsets"]

_log = logging.getLogger(__name__)
_LOGGED: set[tuple[str, int]] = set()  # (journal uri, batch) whose loss this process logged

REPLAY_CHUNK_ROWS = 200_000
"""Rows of ``offsets`` slots read back from Kafka per call: a task's replay holds at most
about this many records (and the records of other tasks in their offset ranges are read and
dropped as they arrive)."""

_FIX = ("Kafka no longer holds every record this journal (journalContent=offsets) refers to. "
        "Set journalContent=records for topics whose records may be gone before a replay "
        "(short retention, compaction, deleteRecords), or keep them longer "
        "(retention.ms above the time a failed batch may take to be re-run, including a "
        "query restart); failOnDataLoss=false skips such records (counted as records_lost "
        "in the source's progress metrics)")


@dataclass(frozen=True)
class ReplaySettings:
    """What a replay from Kafka needs: how to reach the cluster, the share group's isolation
    level, the source's schema (headers), and whether lost records fail the task."""

    client: ClientSettings
    isolation_level: str = "read_uncommitted"
    include_headers: bool = False
    fail_on_data_loss: bool = True


class _Replayed:
    """A plain consumer's message with the delivery count its slot recorded, for
    ``messages_to_batch``."""

    __slots__ = ("_count", "_m")

    def __init__(self, m: Any, count: int) -> None:
        self._m = m
        self._count = count

    def key(self) -> Any:
        return self._m.key()

    def value(self) -> Any:
        return self._m.value()

    def topic(self) -> Any:
        return self._m.topic()

    def partition(self) -> Any:
        return self._m.partition()

    def offset(self) -> Any:
        return self._m.offset()

    def timestamp(self) -> Any:
        return self._m.timestamp()

    def headers(self) -> Any:
        return self._m.headers()

    def delivery_count(self) -> int:
        return self._count


def describe_offsets(offsets: npt.NDArray[np.int64], limit: int = 5) -> str:
    """``offsets`` (sorted) as ranges: ``"3-7, 10, 12-40 (+2 more ranges)"``."""
    if not len(offsets):
        return "none"
    breaks = np.flatnonzero(np.diff(offsets) != 1) + 1
    runs = [(int(r[0]), int(r[-1])) for r in np.split(offsets, breaks)]
    shown = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:limit])
    more = f" (+{len(runs) - limit} more ranges)" if len(runs) > limit else ""
    return f"{shown}{more}"


def _cause(missing: npt.NDArray[np.int64], read: PartitionRead) -> str:
    if read.gone:
        return "the topic or partition does not exist any more: it was deleted"
    below = int(np.count_nonzero(missing < read.low))
    above = int(np.count_nonzero(missing >= read.high))
    causes = []
    if below:
        causes.append(f"{below} below the log start offset {read.low}: deleted by retention or "
                      "deleteRecords")
    if above:
        causes.append(f"{above} at or past the log end offset {read.high}: the topic was "
                      "deleted and re-created, or the log truncated")
    if len(missing) - below - above:
        causes.append(f"{len(missing) - below - above} skipped inside the log: removed by "
                      "compaction, or the topic was re-created")
    return "; ".join(causes)


class SlotReader:
    """Reads data slots of one partition log for yielding (see the module's docstring).

    ``stats``: where ``records_lost``, ``slots_replayed`` and ``records_replayed`` are
    counted (the task's END marker stats, or :meth:`write_losses` after END).
    """

    def __init__(self, log: PartLog, settings: ReplaySettings, stats: Counter[str]) -> None:
        self.log = log
        self.settings = settings
        self.stats = stats

    def read(self, slots: Sequence[int]) -> Iterator[tuple[int, pa.Table | pa.RecordBatch]]:
        """The rows of ``slots``, in order, each as the first attempt yielded it. Kafka is read
        once for all the ``offsets`` slots among them (each partition's range once), in
        chunks of up to :data:`REPLAY_CHUNK_ROWS` rows, which bound the records held."""
        held = [(slot, self.log.slot(slot)) for slot in slots]
        chunk: list[tuple[int, pa.Table | OffsetSlot]] = []
        rows = 0
        for slot, h in held:
            chunk.append((slot, h))
            rows += h.rows if isinstance(h, OffsetSlot) else 0
            if rows >= REPLAY_CHUNK_ROWS:
                yield from self._chunk(chunk)
                chunk, rows = [], 0
        yield from self._chunk(chunk)

    def _chunk(self, held: list[tuple[int, pa.Table | OffsetSlot]]) \
            -> Iterator[tuple[int, pa.Table | pa.RecordBatch]]:
        wanted: dict[TopicPartition, list[npt.NDArray[np.int64]]] = {}
        for _, h in held:
            if isinstance(h, OffsetSlot):
                for tp, offs in h.keys().by_partition.items():
                    wanted.setdefault(tp, []).append(offs)
        reads = read_offsets(self.settings.client,
                             {tp: np.unique(np.concatenate(o)) for tp, o in wanted.items()},
                             isolation_level=self.settings.isolation_level) if wanted else {}
        for slot, h in held:
            yield slot, self._rebuild(slot, h, reads) if isinstance(h, OffsetSlot) else h

    def _rebuild(self, slot: int, held: OffsetSlot,
                 reads: dict[TopicPartition, PartitionRead]) -> pa.RecordBatch:
        tps, which, offsets, counts = held.rows_in_order()
        records = [reads[tp].records for tp in tps]
        msgs: list[Any] = []
        lost: dict[TopicPartition, list[int]] = {}
        for i, off, count in zip(which.tolist(), offsets.tolist(), counts.tolist(), strict=True):
            m = records[i].get(off)
            if m is None:
                lost.setdefault(tps[i], []).append(off)
            else:
                msgs.append(_Replayed(m, count))
        batch = messages_to_batch(msgs, self.settings.include_headers)
        self.stats["slots_replayed"] += 1
        if lost:
            self._lost(slot, {tp: np.asarray(o, np.int64) for tp, o in lost.items()}, reads)
        elif rows_checksum(batch) != held.checksum:
            self._changed(slot, held, tps, reads)
            batch = batch.slice(0, 0)
        self.stats["records_replayed"] += batch.num_rows
        return batch

    def _where(self, slot: int) -> str:
        return (f"batch {self.log.seq}, input partition {self.log.part}, journal slot {slot} "
                f"({self.log.journal.uri})")

    def _lost(self, slot: int, lost: dict[TopicPartition, npt.NDArray[np.int64]],
              reads: dict[TopicPartition, PartitionRead]) -> None:
        what = "; ".join(f"{tp.key()} offsets {describe_offsets(np.sort(o))} "
                         f"({_cause(np.sort(o), reads[tp])})" for tp, o in lost.items())
        count = sum(len(o) for o in lost.values())
        if self.settings.fail_on_data_loss:
            raise DataLossError(f"{self._where(slot)}: {count} journaled record(s) are not in "
                                f"Kafka any more: {what}. {_FIX}")
        self._skipped(count, f"{count} record(s) of {self._where(slot)} are not in Kafka any "
                             f"more and were skipped (failOnDataLoss=false): {what}")

    def _changed(self, slot: int, held: OffsetSlot, tps: list[TopicPartition],
                 reads: dict[TopicPartition, PartitionRead]) -> None:
        spans = ", ".join(f"{tp.key()} offsets {describe_offsets(held.keys().by_partition[tp])}"
                          for tp in tps)
        what = (f"the records Kafka holds at {spans} differ from those first yielded "
                "(checksum mismatch): the topic was deleted and re-created, or its records "
                "rewritten")
        if self.settings.fail_on_data_loss:
            raise DataLossError(f"{self._where(slot)}: {what}. {_FIX}")
        self._skipped(held.rows, f"{held.rows} record(s) of {self._where(slot)} were skipped "
                                 f"(failOnDataLoss=false): {what}")

    def _skipped(self, count: int, message: str) -> None:
        self.stats["records_lost"] += count
        key = (self.log.journal.uri, self.log.seq)
        if key not in _LOGGED:
            _LOGGED.add(key)
            _log.warning("%s. %s", message, _FIX)

    def write_losses(self, attempt: int) -> None:
        """Leave this attempt's ``records_lost`` beside the log's slots (a replay after END,
        whose counters no END marker carries); nothing when none was lost."""
        lost = self.stats.get("records_lost", 0)
        if not lost:
            return
        store = self.log.journal.store
        path = f"{self.log.dir}/{LOSS_PREFIX}{attempt}"
        store.write(path, json.dumps({"records_lost": lost}).encode())
