"""The acknowledgement journal: records are durable here before they are ACCEPTed.

Layout under ``journalPath``::

    batches/<seq>/<part>/<slot>   numbered slots of one Spark input partition of one batch:
                                  each is an Arrow IPC file (records) or an END marker (JSON)
    dedup/<seq>-<part>-<slot>     (topic, partition, offset) of committed records whose
                                  acknowledgement was not confirmed
    committed                     the newest batch Spark committed (a fence for late attempts)

Every slot is created *exclusively*: of all attempts that try to create slot ``n`` exactly one
succeeds. An attempt appends its records at the first free slot; if the slot it finds taken is
an END marker, the partition is closed and it releases its records instead. A partition's
output is the data slots before its first END, so every attempt that returns yields the same
rows, and nothing is ever published after END. See ``docs/design.md``.

Exclusive create needs an atomic no-overwrite primitive: ``link(2)`` on a local or mounted
filesystem, ``rename`` on HDFS. Object stores have none that pyarrow exposes and are refused.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
from pyarrow import ipc

from pyspark_kafka_share._kafka.arrow import KEY_SCHEMA, keys_of
from pyspark_kafka_share.errors import JournalClosed, JournalError, OptionError

__all__ = ["EndMarker", "Journal", "PartLog", "check_journal_uri"]

_ARROW_MAGIC = b"ARROW1"
_LOCAL_SCHEMES = ("", "file")
_HADOOP_SCHEMES = ("hdfs", "viewfs")


def check_journal_uri(uri: str) -> None:
    """Refuse journal locations without an atomic exclusive create (raised at load)."""
    scheme = urlparse(uri).scheme.lower()
    if scheme in _LOCAL_SCHEMES or scheme in _HADOOP_SCHEMES:
        return
    raise OptionError(
        "journalPath", uri,
        f"the '{scheme}' filesystem has no atomic create-if-absent that pyarrow exposes, which "
        "the journal needs so that exactly one task attempt wins each slot. Use a local or "
        "mounted shared path (NFS, a FUSE mount of your store with atomic link) or hdfs://",
    )


# -- storage back ends -----------------------------------------------------------------------


class _Store:
    """Minimal filesystem operations the journal needs."""

    def create_exclusive(self, path: str, data: bytes, fsync: bool) -> bool:
        raise NotImplementedError

    def read(self, path: str) -> bytes:
        raise NotImplementedError

    def write(self, path: str, data: bytes) -> None:
        raise NotImplementedError

    def listdir(self, path: str) -> list[str]:
        raise NotImplementedError

    def makedirs(self, path: str) -> None:
        raise NotImplementedError

    def remove_tree(self, path: str) -> None:
        raise NotImplementedError

    def mtime(self, path: str) -> float:
        raise NotImplementedError

    def remove(self, path: str) -> None:
        raise NotImplementedError

    def retire(self, path: str) -> str:
        """Atomically move ``path`` aside to a hidden sibling; return the new path."""
        raise NotImplementedError


class _LocalStore(_Store):
    def create_exclusive(self, path: str, data: bytes, fsync: bool) -> bool:
        directory = os.path.dirname(path)
        tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)  # atomic; fails if path exists. Never creates the directory.
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if fsync:
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        return True

    def read(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def write(self, path: str, data: bytes) -> None:
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def mtime(self, path: str) -> float:
        return os.stat(path).st_mtime

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def retire(self, path: str) -> str:
        target = os.path.join(os.path.dirname(path), f".gc-{uuid.uuid4().hex}")
        with contextlib.suppress(FileNotFoundError):
            os.rename(path, target)
        return target


class _ArrowFsStore(_Store):  # pragma: no cover - needs a Hadoop cluster; see docs/design.md
    """HDFS through ``pyarrow.fs``: ``move`` is HDFS rename, which refuses an existing target."""

    def __init__(self, uri: str) -> None:
        from pyarrow import fs as pafs

        self.fs, _ = pafs.FileSystem.from_uri(uri)

    def create_exclusive(self, path: str, data: bytes, fsync: bool) -> bool:
        tmp = f"{os.path.dirname(path)}/.tmp-{uuid.uuid4().hex}"
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        try:
            self.fs.move(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                self.fs.delete_file(tmp)
            if self._exists(path):
                return False
            raise
        return True

    def _exists(self, path: str) -> bool:
        from pyarrow import fs as pafs

        return bool(self.fs.get_file_info(path).type != pafs.FileType.NotFound)

    def read(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as f:
            return bytes(f.read())

    def write(self, path: str, data: bytes) -> None:
        with self.fs.open_output_stream(path) as out:
            out.write(data)

    def listdir(self, path: str) -> list[str]:
        from pyarrow import fs as pafs

        try:
            infos = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        except FileNotFoundError:
            return []
        return [os.path.basename(i.path) for i in infos]

    def makedirs(self, path: str) -> None:
        self.fs.create_dir(path, recursive=True)

    def remove_tree(self, path: str) -> None:
        with contextlib.suppress(OSError):
            self.fs.delete_dir(path)

    def mtime(self, path: str) -> float:
        info = self.fs.get_file_info(path)
        return float(info.mtime.timestamp()) if info.mtime else time.time()

    def remove(self, path: str) -> None:
        with contextlib.suppress(OSError):
            self.fs.delete_file(path)

    def retire(self, path: str) -> str:
        target = f"{os.path.dirname(path)}/.gc-{uuid.uuid4().hex}"
        with contextlib.suppress(OSError):
            self.fs.move(path, target)
        return target


def _store_for(uri: str) -> tuple[_Store, str]:
    parsed = urlparse(uri)
    if parsed.scheme.lower() in _LOCAL_SCHEMES:
        return _LocalStore(), os.path.abspath(parsed.path if parsed.scheme else uri)
    return _ArrowFsStore(uri), parsed.path


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


# Parsed key sets of immutable slot files, shared by all tasks of this worker process.
_KEY_CACHE: OrderedDict[str, frozenset[tuple[str, int, int]]] = OrderedDict()
_KEY_CACHE_LOCK = threading.Lock()
_KEY_CACHE_MAX = 4096
_CLAIMED: dict[str, str] = {}  # journal uri -> query id already checked by this process


class Journal:
    """One query's journal directory."""

    def __init__(self, uri: str, *, fsync: bool = True) -> None:
        self.uri = uri
        self.store, self.root = _store_for(uri)
        self.fsync = fsync

    def _p(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    @staticmethod
    def _seq(seq: int) -> str:
        return f"{seq:012d}"

    def part_log(self, seq: int, part: int) -> PartLog:
        return PartLog(self, seq, part)

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
        if not self.store.create_exclusive(path, query_id.encode(), self.fsync):
            owner = self.store.read(path).decode()
            if owner != query_id:
                raise JournalError(
                    f"journalPath {self.uri!r} belongs to streaming query {owner}, not to this "
                    f"query ({query_id}). Give every query its own journal, like its "
                    "checkpoint; if the old query is gone for good, delete the directory")
        _CLAIMED[self.uri] = query_id

    def in_use(self) -> str | None:
        """What shows that a query already committed batches with this journal, or None.

        Uncommitted batches alone do not count: Spark restarts a query whose first batch
        never committed from its initial offset, and that batch must replay its journal.
        """
        seq = self.committed_seq()
        return f"it records committed batch {seq}" if seq >= 0 else None

    # -- de-duplication -----------------------------------------------------------------

    def _slot_keys(self, path: str) -> frozenset[tuple[str, int, int]]:
        with _KEY_CACHE_LOCK:
            hit = _KEY_CACHE.get(path)
            if hit is not None:
                _KEY_CACHE.move_to_end(path)
                return hit
        data = self.store.read(path)
        if not data.startswith(_ARROW_MAGIC):
            keys: frozenset[tuple[str, int, int]] = frozenset()
        else:
            keys = frozenset(keys_of(_from_ipc(data)))
        with _KEY_CACHE_LOCK:
            _KEY_CACHE[path] = keys
            while len(_KEY_CACHE) > _KEY_CACHE_MAX:
                _KEY_CACHE.popitem(last=False)
        return keys

    def find_journaled(
        self, candidates: set[tuple[str, int, int]]
    ) -> set[tuple[str, int, int]]:
        """Those of ``candidates`` that some published slot or dedup entry already holds."""
        if not candidates:
            return set()
        found: set[tuple[str, int, int]] = set()
        paths: list[str] = []
        # Fence first: keys of committed batches are in dedup/ (written before the fence),
        # and a committed batch directory may hold a late attempt's withdrawn slot.
        fence = self.committed_seq()
        for seq in self.store.listdir(self._p("batches")):
            if seq.startswith(".") or int(seq) <= fence:
                continue
            for part in self.store.listdir(self._p("batches", seq)):
                paths.extend(self._p("batches", seq, part, name)
                             for name in self.store.listdir(self._p("batches", seq, part))
                             if not name.startswith("."))
        paths.extend(self._p("dedup", n) for n in self.store.listdir(self._p("dedup"))
                     if not n.startswith("."))
        for path in paths:
            try:
                found |= candidates & self._slot_keys(path)
            except FileNotFoundError:
                continue  # cleaned up meanwhile: its keys are in dedup/
            if len(found) == len(candidates):
                break
        return found

    # -- driver side --------------------------------------------------------------------

    def batch_ends(self, seq: int) -> dict[int, EndMarker]:
        """END markers of batch ``seq``, by partition."""
        ends: dict[int, EndMarker] = {}
        for part in self.store.listdir(self._p("batches", self._seq(seq))):
            if part.startswith("."):
                continue
            log = self.part_log(seq, int(part))
            end = log.scan().end
            if end is not None:
                ends[int(part)] = end
        return ends

    def commit(self, seq: int, dedup_retention_ms: int,
               start_offsets: dict[str, int] | None = None) -> None:
        """Batch ``seq`` is committed by Spark: keep dedup keys, fence it, delete its data.

        Order matters: dedup entries first (``find_journaled`` skips fenced batches), then
        the fence, then each batch directory is renamed aside before it is deleted.
        """
        self.store.makedirs(self._p("dedup"))
        done = [n for n in sorted(self.store.listdir(self._p("batches")))
                if not n.startswith(".") and int(n) <= seq]
        for name in done:
            for part in self.store.listdir(self._p("batches", name)):
                if part.startswith("."):
                    continue
                log = self.part_log(int(name), int(part))
                scan = log.scan()
                acked = set(scan.end.acked_slots) if scan.end else set()
                for slot in scan.data_slots:
                    if slot in acked:
                        continue  # acknowledged and confirmed: never redelivered
                    keys = pa.Table.from_pylist(
                        [{"topic": t, "partition": p, "offset": o}
                         for t, p, o in sorted(self._slot_keys(log.slot_path(slot)))],
                        schema=KEY_SCHEMA,
                    )
                    target = self._p("dedup", f"{name}-{int(part):05d}-{slot:06d}")
                    self.store.create_exclusive(target, _to_ipc(keys), self.fsync)
        self.store.write(self._p("committed"), json.dumps({"seq": seq}).encode())
        for name in done:
            # Renamed first: a late attempt's link into the old path then fails (ENOENT).
            self.store.remove_tree(self.store.retire(self._p("batches", name)))
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
                    done = all(off < start_offsets.get(f"{t}:{p}", -1) for t, p, off in keys)
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
        names = sorted(n for n in self.journal.store.listdir(self.dir) if n.isdigit())
        data: list[int] = []
        end: EndMarker | None = None
        slot = 0
        for name in names:
            if int(name) != slot:
                break  # slots are contiguous; nothing can follow a gap
            raw = self.journal.store.read(self.slot_path(slot))
            if raw.startswith(_ARROW_MAGIC):
                data.append(slot)
            else:
                end = EndMarker.from_bytes(raw)
                break
            slot += 1
        self._next = slot
        return ScanResult(data, end, slot)

    def append(self, batch: pa.RecordBatch, attempt: int) -> int:
        """Publish ``batch`` in the first free slot; return the slot number.

        The slot records ``attempt`` (the writing task attempt). Raises :class:`JournalClosed`
        if the log was ENDed first (nothing was published).
        """
        payload = _to_ipc(batch, {"attempt": str(attempt)})
        while True:
            slot = self._next
            try:
                won = self.journal.store.create_exclusive(self.slot_path(slot), payload,
                                                          self.journal.fsync)
            except FileNotFoundError as exc:  # the batch directory was cleaned up: committed
                raise JournalClosed(f"batch {self.seq} was committed meanwhile") from exc
            except OSError as exc:
                if exc.errno == errno.ENOENT:
                    raise JournalClosed(f"batch {self.seq} was committed meanwhile") from exc
                raise JournalError(f"cannot write journal slot {self.slot_path(slot)}: "
                                   f"{exc}") from exc
            self._next = slot + 1
            if won:
                return slot
            taken = self.journal.store.read(self.slot_path(slot))
            if taken == payload:
                # Our own create, retried by the filesystem client (NFS, HDFS failover) and
                # reported as "exists": the payload names this attempt, so it is ours.
                return slot
            if not taken.startswith(_ARROW_MAGIC):
                raise JournalClosed(f"partition {self.part} of batch {self.seq} is closed")

    def withdraw(self, slot: int) -> None:
        """Delete our own slot of a batch that Spark already committed (nobody reads it)."""
        self.journal.store.remove(self.slot_path(slot))

    def end(self, marker_for: Any) -> ScanResult:
        """Close the log with an END marker (``marker_for(scan) -> EndMarker``); return the
        final scan. If another attempt ENDed first, its marker stands."""
        while True:
            scan = self.scan()
            if scan.end is not None:
                return scan
            marker: EndMarker = marker_for(scan)
            try:
                won = self.journal.store.create_exclusive(
                    self.slot_path(scan.next_slot), marker.to_bytes(), self.journal.fsync)
            except FileNotFoundError as exc:
                raise JournalClosed(f"batch {self.seq} was committed meanwhile") from exc
            if won:
                return ScanResult(scan.data_slots, marker, scan.next_slot)

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
