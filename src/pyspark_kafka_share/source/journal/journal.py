"""The acknowledgement journal: records are durable here before they are ACCEPTed.

Layout under ``journalPath``::

    batches/<seq>/<part>/<slot>   numbered slots of one Spark input partition of one batch:
                                  each is an Arrow IPC file (records) or an END marker (JSON)
    dedup/<seq>-<part>-<slot>     (topic, partition, offset) of committed records whose
                                  acknowledgement was not confirmed
    committed                     the newest batch Spark committed (a fence for late attempts)
    owner                         the streaming query that owns the journal
    markers/<id>                  written by the driver when a query starts; every task must
                                  see it before it acknowledges anything (one shared journal)

Every slot is created *exclusively*: of all attempts that try to create slot ``n`` exactly one
succeeds. An attempt appends its records at the first free slot; if the slot it finds taken is
an END marker, the partition is closed and it releases its records instead. A partition's
output is the data slots before its first END, so every attempt that returns yields the same
rows, and nothing is ever published after END. Slots are contiguous and END is the last one,
so a log's state is known from one listing plus the first bytes of its last slot.

Exclusive create is ``link(2)`` on a local or mounted filesystem, ``rename`` on HDFS, and a
conditional put on S3, GCS and Azure (see :mod:`.stores`). Object stores have no rename: a late
attempt of a committed batch can still create a slot there, and it withdraws it after seeing
the ``committed`` fence, which it reads after every append; ``commit`` writes de-duplication
keys only for batches above the previous fence, so such a slot is never taken for published
data, and later commits delete it. See ``docs/design.md`` ("The journal on object stores").
"""

from __future__ import annotations

import errno
import json
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
from pyarrow import ipc

from pyspark_kafka_share._kafka.arrow import KEY_SCHEMA
from pyspark_kafka_share.errors import JournalClosed, JournalError
from pyspark_kafka_share.source.journal.keys import EMPTY_INDEX, Key, KeyIndex, SlotKeys
from pyspark_kafka_share.source.journal.stores import check_journal, check_journal_uri, store_for

if TYPE_CHECKING:
    from pyspark_kafka_share.source.options import SourceOptions

__all__ = ["EndMarker", "Journal", "PartLog", "ScanResult", "check_journal", "check_journal_uri"]

_ARROW_MAGIC = b"ARROW1"
# Give up on a slot after this many "exists" answers for an object that cannot be read.
_MAX_CONFLICTS = 50


# -- serialisation ----------------------------------------------------------------------------


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


def _from_ipc(data: bytes) -> pa.Table:
    """The table of an IPC file, without schema metadata (Spark wants the exact schema)."""
    return ipc.open_file(pa.BufferReader(data)).read_all().replace_schema_metadata(None)


@dataclass(frozen=True)
class EndMarker:
    """Closes a partition log; written by the attempt that finished it.

    ``min_offsets``: lowest offset per ``"topic:partition"`` among the records the log emits
    and those the ending attempt acquired (also released ones): AvailableNow's progress.
    """

    attempt: int
    data_slots: int
    records: int
    acked_slots: tuple[int, ...] = ()
    stats: dict[str, int] = field(default_factory=dict)
    min_offsets: dict[str, int] = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return json.dumps({
            "end": True, "attempt": self.attempt, "data_slots": self.data_slots,
            "records": self.records, "acked_slots": list(self.acked_slots),
            "stats": self.stats, "min_offsets": self.min_offsets,
        }).encode()

    @staticmethod
    def from_bytes(data: bytes) -> EndMarker:
        doc = json.loads(data)
        return EndMarker(attempt=int(doc["attempt"]), data_slots=int(doc["data_slots"]),
                         records=int(doc["records"]),
                         acked_slots=tuple(int(i) for i in doc.get("acked_slots", ())),
                         stats={k: int(v) for k, v in doc.get("stats", {}).items()},
                         min_offsets={k: int(v) for k, v in doc.get("min_offsets", {}).items()})


# Parsed keys of immutable slot files, shared by all tasks of this worker process. Entries of a
# journal are dropped when a new run of a query starts (a new marker: the directory may have
# been deleted and reused) and, for committed batches, when the fence passes them.
_KEY_CACHE: OrderedDict[str, SlotKeys] = OrderedDict()
_KEY_CACHE_LOCK = threading.Lock()
_KEY_CACHE_MAX = 4096
_KEY_CACHE_FENCE: dict[str, int] = {}  # journal uri -> fence its entries were pruned at
# journal uri -> the union of the keys of the open slots seen last (rebuilt from _KEY_CACHE
# when one of them is gone: committed, withdrawn, pruned)
_INDEX: dict[str, KeyIndex] = {}
_CLAIMED: dict[str, str] = {}  # journal uri -> query id already checked by this process
_MARKERS_SEEN: set[tuple[str, str]] = set()  # (journal uri, marker) seen by this process


class Journal:
    """One query's journal directory (or key prefix, on an object store).

    ``options``: ``journal.<key>`` settings of an object-store journal (endpoint,
    credentials, ...), without the prefix. Never logged nor shown in errors.
    """

    def __init__(self, uri: str, *, fsync: bool = True,
                 options: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        self.uri = uri
        self.store, self.root = store_for(uri, options)
        self.fsync = fsync

    @classmethod
    def of(cls, options: SourceOptions) -> Journal:
        """The journal of a source's options (``journalPath`` must be set)."""
        assert options.journal_path is not None
        return cls(options.journal_path, fsync=options.journal_fsync,
                   options=options.journal_options)

    def __repr__(self) -> str:
        return f"Journal({self.uri!r})"

    def _p(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    @staticmethod
    def _seq(seq: int) -> str:
        return f"{seq:012d}"

    def part_log(self, seq: int, part: int) -> PartLog:
        return PartLog(self, seq, part)

    def _batch_names(self) -> list[str]:
        """Names of the batch directories, oldest first."""
        return sorted(n for n in self.store.listdir(self._p("batches")) if n.isdigit())

    def batches(self) -> list[int]:
        """The batches the journal still holds (uncommitted ones, and leftovers of committed
        ones until the next commit deletes them), oldest first."""
        return [int(n) for n in self._batch_names()]

    # -- the committed fence ------------------------------------------------------------

    def committed_seq(self) -> int:
        try:
            return int(json.loads(self.store.read(self._p("committed")))["seq"])
        except FileNotFoundError:
            return -1
        except (OSError, ValueError, KeyError) as exc:
            raise JournalError(f"cannot read {self._p('committed')}: {exc}") from exc

    def claim(self, query_id: str) -> None:
        """Make ``query_id`` (Spark's streaming query id, stable across restarts) the journal's
        owner, or raise :class:`JournalError` if another query owns it."""
        if _CLAIMED.get(self.uri) == query_id:
            return
        self.store.makedirs(self.root)
        path = self._p("owner")
        for _ in range(_MAX_CONFLICTS):
            if self.store.create_exclusive(path, query_id.encode(), self.fsync):
                break
            try:
                owner = self.store.read(path).decode()
            except FileNotFoundError:
                continue  # reported as existing, yet absent (a conflicting create): retry
            if owner != query_id:
                raise JournalError(
                    f"journalPath {self.uri!r} belongs to streaming query {owner}, not to this "
                    f"query ({query_id}). Give every query its own journal, like its "
                    "checkpoint; if the old query is gone for good, delete the directory")
            break
        else:
            raise JournalError(f"cannot create {path}: the store keeps reporting a conflict")
        _CLAIMED[self.uri] = query_id

    # -- one journal for the driver and every executor -----------------------------------

    def place_marker(self) -> str:
        """Leave a new marker for this run's tasks (driver); its name. Markers of runs older
        than a week are removed."""
        self.store.makedirs(self._p("markers"))
        name = uuid.uuid4().hex
        self.store.create_exclusive(self._p("markers", name), b"driver", self.fsync)
        week_ago = time.time() - 7 * 24 * 3600
        for old in self.store.listdir(self._p("markers")):
            path = self._p("markers", old)
            try:
                if old != name and not old.startswith(".") and self.store.mtime(path) < week_ago:
                    self.store.remove(path)
            except FileNotFoundError:
                continue
        return name

    def check_marker(self, name: str) -> None:
        """Raise :class:`JournalError` unless the driver's marker ``name`` is visible here: a
        journal path that is not one place for the driver and every executor (a node-local or
        relative path on a cluster) would break exactly-once. Called before any record is
        acknowledged; cached per process."""
        if (self.uri, name) in _MARKERS_SEEN:
            return
        try:
            self.store.read(self._p("markers", name))
        except FileNotFoundError:
            raise JournalError(
                f"option 'journalPath' = {self.uri!r} is not the same place on this executor "
                f"host ({socket.gethostname()}) as on the driver: the marker the driver wrote "
                "there when the query started is missing. Exactly-once needs one journal that "
                "the driver and every executor share: an absolute path on a shared filesystem "
                "(NFS, HDFS) or an object store (s3://, gs://, abfss://). Nothing was "
                "acknowledged") from None
        _MARKERS_SEEN.add((self.uri, name))
        # A new run: what this process cached may be stale (a deleted and reused directory).
        _KEY_CACHE_FENCE.pop(self.uri, None)
        self._forget_keys(lambda _: True)

    def _forget_keys(self, stale: Callable[[str], bool]) -> None:
        """Drop this journal's cached slot keys whose path ``stale(path)`` says."""
        prefix = f"{self.uri}\0"
        with _KEY_CACHE_LOCK:
            _INDEX.pop(self.uri, None)
            for key in [k for k in _KEY_CACHE if k.startswith(prefix) and stale(k[len(prefix):])]:
                del _KEY_CACHE[key]

    def _forget_committed_keys(self, fence: int) -> None:
        """Drop cached keys of slots of batches at or below ``fence`` (never read again)."""
        if _KEY_CACHE_FENCE.get(self.uri, -1) >= fence:
            return
        _KEY_CACHE_FENCE[self.uri] = fence

        def committed(path: str) -> bool:
            parts = path.rsplit("/", 4)
            return len(parts) == 5 and parts[1] == "batches" and parts[2].isdigit() \
                and int(parts[2]) <= fence

        self._forget_keys(committed)

    def in_use(self) -> str | None:
        """What shows that a query already committed batches with this journal, or None.

        Uncommitted batches alone do not count: Spark restarts a query whose first batch
        never committed from its initial offset, and that batch must replay its journal.
        """
        seq = self.committed_seq()
        return f"it records committed batch {seq}" if seq >= 0 else None

    # -- de-duplication -----------------------------------------------------------------

    def _slot_keys(self, path: str) -> SlotKeys:
        cache_key = f"{self.uri}\0{path}"
        with _KEY_CACHE_LOCK:
            hit = _KEY_CACHE.get(cache_key)
            if hit is not None:
                _KEY_CACHE.move_to_end(cache_key)
                return hit
        data = self.store.read(path)
        keys = SlotKeys.of_table(_from_ipc(data)) if data.startswith(_ARROW_MAGIC) \
            else SlotKeys({})
        self._remember(path, keys)
        return keys

    def _remember(self, path: str, keys: SlotKeys) -> None:
        with _KEY_CACHE_LOCK:
            _KEY_CACHE[f"{self.uri}\0{path}"] = keys
            while len(_KEY_CACHE) > _KEY_CACHE_MAX:
                _KEY_CACHE.popitem(last=False)

    def _open_slots(self) -> list[str]:
        """Paths of the slots of uncommitted batches and of the dedup entries.

        The fence is read first: keys of committed batches are in dedup/ (written before the
        fence), and a committed batch directory may hold a late attempt's withdrawn slot.
        Two listings, whatever the number of batches and partitions.
        """
        fence = self.committed_seq()
        self._forget_committed_keys(fence)
        paths: list[str] = []
        for rel in self.store.files_under(self._p("batches")):
            parts = rel.split("/")
            if len(parts) == 3 and all(x.isdigit() for x in parts) and int(parts[0]) > fence:
                paths.append(self._p("batches", *parts))
        paths.extend(self._p("dedup", n) for n in self.store.listdir(self._p("dedup"))
                     if not n.startswith("."))
        return paths

    def find_journaled(self, candidates: set[Key] | SlotKeys) -> set[Key]:
        """Those of ``candidates`` that some published slot or dedup entry already holds."""
        wanted = candidates if isinstance(candidates, SlotKeys) else SlotKeys.of(candidates)
        if not wanted.by_partition:
            return set()
        return self._index(self._open_slots()).find(wanted)

    def _index(self, paths: list[str]) -> KeyIndex:
        """The keys of the slots at ``paths``: the index built for the previous lookup plus
        the new slots, or rebuilt when one it holds is gone (its keys must not count)."""
        with _KEY_CACHE_LOCK:
            index = _INDEX.get(self.uri, EMPTY_INDEX)
        now = set(paths)
        if not index.paths <= now:
            index = EMPTY_INDEX
        for path in sorted(now - index.paths):
            try:
                index = index.plus(path, self._slot_keys(path))
            except FileNotFoundError:
                continue  # cleaned up meanwhile: its keys are in dedup/
        with _KEY_CACHE_LOCK:
            _INDEX[self.uri] = index
        return index

    # -- driver side --------------------------------------------------------------------

    def batch_ends(self, seq: int) -> dict[int, EndMarker]:
        """END markers of batch ``seq``, by partition."""
        ends: dict[int, EndMarker] = {}
        for part in self.store.listdir(self._p("batches", self._seq(seq))):
            if not part.isdigit():
                continue
            try:
                end = self.part_log(seq, int(part)).scan().end
            except JournalClosed:
                continue  # committed and deleted meanwhile
            if end is not None:
                ends[int(part)] = end
        return ends

    def commit(self, seq: int, dedup_retention_ms: int,
               start_offsets: dict[str, int] | None = None) -> None:
        """Batch ``seq`` is committed by Spark: keep dedup keys, fence it, delete its data.

        Order matters: dedup entries first (``find_journaled`` skips fenced batches), then
        the fence, then the batch directories (renamed aside first where the store can).

        Dedup entries are written only for batches above the previous fence. A batch at or
        below it was committed before, with its entries; whatever is in it now was written by
        a late attempt after that commit (possible on object stores, which cannot rename the
        directory away), was never acknowledged, and is only deleted here: taking its records
        for published ones would drop their redeliveries.
        """
        self.store.makedirs(self._p("dedup"))
        previous = self.committed_seq()
        done = [n for n in self._batch_names() if int(n) <= seq]
        for name in done:
            if int(name) <= previous:
                continue
            for part in self.store.listdir(self._p("batches", name)):
                if not part.isdigit():
                    continue
                log = self.part_log(int(name), int(part))
                scan = log.scan()
                acked = set(scan.end.acked_slots) if scan.end else set()
                for slot in scan.data_slots:
                    if slot in acked:
                        continue  # acknowledged and confirmed: never redelivered
                    keys = pa.Table.from_pylist(
                        [{"topic": t, "partition": p, "offset": o}
                         for t, p, o in sorted(self._slot_keys(log.slot_path(slot)).keys())],
                        schema=KEY_SCHEMA,
                    )
                    target = self._p("dedup", f"{name}-{int(part):05d}-{slot:06d}")
                    self.store.create_exclusive(target, _to_ipc(keys), self.fsync)
        if seq > previous:
            self.store.write(self._p("committed"), json.dumps({"seq": seq}).encode())
        for name in done:
            # Renamed first where possible: a late attempt's link into the old path then
            # fails (ENOENT). Without rename, the fence does that job (see the docstring).
            self.store.remove_tree(self.store.retire(self._p("batches", name)))
        if self.store.renames:
            for name in self.store.listdir(self._p("batches")):
                if name.startswith(".gc-"):
                    self.store.remove_tree(self._p("batches", name))
        self.prune_dedup(start_offsets, dedup_retention_ms)

    def prune_dedup(self, start_offsets: dict[str, int] | None, retention_ms: int) -> None:
        """Drop dedup entries that can no longer match a redelivery.

        With the group's share-partition start offsets (``{"topic:partition": offset}``), an
        entry goes once all its records are below them: records there are acknowledged or
        archived for good and are never delivered again. That bound is exact, so the time
        limit ``retention_ms`` applies only when the start offsets could not be read.
        """
        for name in self.store.listdir(self._p("dedup")):
            if name.startswith("."):
                continue
            path = self._p("dedup", name)
            try:
                if start_offsets is not None:
                    keys = self._slot_keys(path)
                    done = all(keys.highest((t, p)) < start_offsets.get(f"{t}:{p}", -1)
                               for t, p in keys.by_partition)
                else:
                    done = retention_ms > 0 and \
                        self.store.mtime(path) < time.time() - retention_ms / 1000
            except FileNotFoundError:
                continue
            if done:
                self.store.remove(path)


@dataclass
class ScanResult:
    data_slots: list[int]
    end: EndMarker | None
    next_slot: int


class PartLog:
    """The slot log of one input partition of one batch."""

    def __init__(self, journal: Journal, seq: int, part: int) -> None:
        self.journal = journal
        self.seq = seq
        self.part = part
        self.dir = journal._p("batches", journal._seq(seq), f"{part:05d}")
        self._next = 0

    def slot_path(self, slot: int) -> str:
        return f"{self.dir}/{slot:06d}"

    def open(self) -> ScanResult:
        """Create the directory, then check the fence (in this order; see docs/design.md)."""
        self.journal.store.makedirs(self.dir)
        if self.journal.committed_seq() >= self.seq:
            raise JournalClosed(f"batch {self.seq} is already committed")
        return self.scan()

    def scan(self) -> ScanResult:
        """The log's data slots, END marker and first free slot.

        Reads one listing and the first bytes of the last slot only: slots are contiguous
        from 0 (each is created only by an attempt that found the one before taken) and END,
        if any, is the last (an attempt that finds a slot taken by END stops). Raises
        :class:`JournalClosed` if that slot vanished (its batch was committed and deleted).
        """
        store = self.journal.store
        numbers = sorted(int(n) for n in store.listdir(self.dir) if n.isdigit())
        count = 0
        for number in numbers:
            if number != count:
                break  # a gap: only in a committed batch (a withdrawn slot); stop there
            count += 1
        if count == 0:
            self._next = 0
            return ScanResult([], None, 0)
        last = count - 1
        try:
            head = store.read_head(self.slot_path(last), len(_ARROW_MAGIC))
            end = None if head == _ARROW_MAGIC else \
                EndMarker.from_bytes(store.read(self.slot_path(last)))
        except FileNotFoundError as exc:
            raise JournalClosed(f"batch {self.seq} was committed meanwhile") from exc
        if end is None:
            self._next = count
            return ScanResult(list(range(count)), None, count)
        self._next = last
        return ScanResult(list(range(last)), end, last)

    def _create(self, slot: int, payload: bytes) -> bool:
        try:
            return self.journal.store.create_exclusive(self.slot_path(slot), payload,
                                                       self.journal.fsync)
        except FileNotFoundError as exc:  # the batch directory was cleaned up: committed
            raise JournalClosed(f"batch {self.seq} was committed meanwhile") from exc
        except JournalError:
            raise
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise JournalClosed(f"batch {self.seq} was committed meanwhile") from exc
            raise JournalError(f"cannot write journal slot {self.slot_path(slot)}: "
                               f"{exc}") from exc

    def append(self, batch: pa.RecordBatch, attempt: int, keys: SlotKeys | None = None) -> int:
        """Publish ``batch`` in the first free slot; return the slot number.

        The slot records ``attempt`` (the writing task attempt); ``keys`` are the batch's, if
        the caller has them already. Raises :class:`JournalClosed` if the log was ENDed first
        (nothing was published).
        """
        payload = _to_ipc(batch, {"attempt": str(attempt)})
        conflicts = 0
        while True:
            slot = self._next
            if self._create(slot, payload):
                self._next = slot + 1
                self.journal._remember(self.slot_path(slot),
                                      keys if keys is not None else SlotKeys.of_table(batch))
                return slot
            try:
                taken = self.journal.store.read(self.slot_path(slot))
            except FileNotFoundError:
                # Reported as existing, yet absent: S3's 409 for a conditional write still in
                # flight elsewhere, or a slot deleted meanwhile. Try the same slot again.
                conflicts += 1
                if conflicts >= _MAX_CONFLICTS:
                    raise JournalError(f"cannot create journal slot {self.slot_path(slot)}: "
                                       "the store keeps reporting a conflict") from None
                time.sleep(min(0.01 * conflicts, 0.2))
                continue
            self._next = slot + 1
            if taken == payload:
                # Our own create, retried by the filesystem client (NFS, HDFS failover, an
                # object store's retry) and reported as "exists": the payload names this
                # attempt, so it is ours.
                return slot
            if not taken.startswith(_ARROW_MAGIC):
                raise JournalClosed(f"partition {self.part} of batch {self.seq} is closed")

    def withdraw(self, slot: int) -> None:
        """Delete our own slot of a batch that Spark already committed (nobody reads it)."""
        self.journal.store.remove(self.slot_path(slot))

    def end(self, marker_for: Callable[[ScanResult], EndMarker]) -> ScanResult:
        """Close the log with an END marker (``marker_for(scan) -> EndMarker``); return the
        final scan. If another attempt ENDed first, its marker stands."""
        for attempt in range(_MAX_CONFLICTS):
            scan = self.scan()
            if scan.end is not None:
                return scan
            marker: EndMarker = marker_for(scan)
            if self._create(scan.next_slot, marker.to_bytes()):
                return ScanResult(scan.data_slots, marker, scan.next_slot)
            time.sleep(min(0.01 * attempt, 0.2))  # lost the slot: look again
        raise JournalError(f"cannot END journal log {self.dir}: the store keeps reporting a "
                           "conflict")

    def writer(self, slot: int) -> int:
        """The task attempt that published data slot ``slot``."""
        data = self.journal.store.read(self.slot_path(slot))
        meta = ipc.open_file(pa.BufferReader(data)).schema.metadata or {}
        return int(meta.get(b"attempt", b"-1"))

    def table(self, slot: int) -> pa.Table:
        """The records of data slot ``slot``."""
        return _from_ipc(self.journal.store.read(self.slot_path(slot)))

    def read(self, scan: ScanResult) -> Iterator[pa.RecordBatch]:
        """The records of the data slots before END, in slot order."""
        for slot in scan.data_slots:
            yield from self.table(slot).to_batches()
