"""The acknowledgement journal: each poll is durable here before its records are ACCEPTed.

Layout under ``journalPath``::

    batches/<seq>/<part>/<slot>   numbered slots of one Spark input partition of one batch:
                                  each is an Arrow IPC file (the poll's offsets and checksum,
                                  or its records: ``JournalSettings.content``) or an END
                                  marker (JSON); ``lost-<attempt>``: records a re-run skipped
    index/<topic>/<partition>/... one entry per slot and topic-partition, named by the offsets
                                  it covers, and the dedup entries: (topic, partition, offset)
                                  of committed records whose acknowledgement was not confirmed
                                  (:mod:`.index`)
    committed                     the newest batch Spark committed (a fence for late attempts)
    owner                         the streaming query that owns the journal
    markers/<id>                  written by the driver when a query starts; every task must
                                  see it before it acknowledges anything (one shared journal)
    layout                        the layout's version (:data:`.index.LAYOUT`)

Who may write where (exclusive slots, END, the ``committed`` fence) is in :mod:`.fencing`;
what the files hold in :mod:`.slots`. This module is the journal as a whole: its owner, the
driver's markers, the duplicate lookup through the index (:mod:`.index`), and commit.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share.errors import JournalClosed, JournalError
from pyspark_kafka_share.source.journal.fencing import (
    MAX_CONFLICTS,
    PartLog,
    ScanResult,
    clock,
    raise_fence,
    read_fence,
)
from pyspark_kafka_share.source.journal.index import (
    INDEX_DIR,
    LAYOUT,
    LAYOUT_FILE,
    IndexEntry,
    after,
    overlapping,
    tp_dir,
)
from pyspark_kafka_share.source.journal.keys import Key, SlotKeys
from pyspark_kafka_share.source.journal.location import JournalLocation
from pyspark_kafka_share.source.journal.probe import check_journal, check_journal_uri
from pyspark_kafka_share.source.journal.retention import Retention, batch_of, delete_batches
from pyspark_kafka_share.source.journal.slots import Content, EndMarker, dedup_entry, keys_of
from pyspark_kafka_share.source.journal.stores import store_for
from pyspark_kafka_share.source.journal.stores.retry import DEFAULT_RETRY_TIMEOUT_MS

__all__ = ["EndMarker", "Journal", "JournalLocation", "JournalSettings", "PartLog", "ScanResult",
           "check_journal", "check_journal_uri"]

# Parsed keys of immutable slot files, shared by all tasks of this worker process. Entries of a
# journal are dropped when a new run of a query starts (a new marker: the directory may have
# been deleted and reused) and, for committed batches, when the fence passes them.
_KEY_CACHE: OrderedDict[str, SlotKeys] = OrderedDict()
_KEY_CACHE_LOCK = threading.Lock()
_KEY_CACHE_MAX = 4096
_KEY_CACHE_FENCE: dict[str, int] = {}  # journal uri -> fence its entries were pruned at
_CLAIMED: dict[str, str] = {}  # journal uri -> query id already checked by this process
_MARKERS_SEEN: set[tuple[str, str]] = set()  # (journal uri, marker) seen by this process
_HOST_DIR: Path | None = None  # where host_checked() notes its checks (None: the temp dir)


def _host_note(*what: str) -> Path:
    """The file that says this host passed the check ``what`` (see :func:`host_checked`)."""
    digest = hashlib.sha256("\0".join(what).encode()).hexdigest()[:40]
    return (_HOST_DIR or Path(tempfile.gettempdir()) / "pyspark-kafka-share-journal") / digest


def host_checked(*what: str) -> bool:
    """Whether a process of this host already passed the check ``what`` (the marker, the
    owner) in this run of the query (``what`` names the journal and the driver's marker).

    Spark's Python workers come and go: per process the marker and the owner cost two GETs
    per task and micro-batch on an object store (measured; issue 36). Both answers hold for
    the whole run: the marker says the path reaches the driver's journal from this host, and
    the owner does not change while its query runs."""
    return _host_note(*what).exists()


def _note_host_check(*what: str) -> None:
    with contextlib.suppress(OSError):  # best effort: without it the check is just repeated
        note = _host_note(*what)
        note.parent.mkdir(parents=True, exist_ok=True)
        note.touch()


@dataclass(frozen=True)
class JournalSettings:
    """Where a journal is and how it writes; built by the source from its options.

    ``location``: ``journalPath``, parsed when the options were validated.
    ``store_options``: ``journal.<key>`` settings of an object-store journal (endpoint,
    credentials, ...), without the prefix. Never logged nor shown (``repr=False``).
    ``content``: what a new data slot holds (:mod:`.slots`): ``offsets`` (replayed from
    Kafka) or ``records``. Reading needs no setting: each slot says what it holds.
    ``retry_timeout_ms``: how long an object store's call rides out an outage
    (``journalRetryTimeoutMs``; :mod:`.stores.retry`).
    ``retention_ms``: how long a committed batch's slots are kept (``journalRetentionMs``;
    0: deleted at the commit, and every slot's fence re-read; see :mod:`.fencing`).
    """

    location: JournalLocation
    fsync: bool = True
    store_options: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    content: Content = "offsets"
    retry_timeout_ms: int = DEFAULT_RETRY_TIMEOUT_MS
    retention_ms: int = 0


class Journal:
    """One query's journal directory (or key prefix, on an object store).

    ``location``: where it is, parsed (the source passes the one its options hold); a
    ``journalPath`` string is parsed here, for callers that open a journal by its path.
    ``options``: ``journal.<key>`` settings of an object-store journal (endpoint,
    credentials, ...), without the prefix. Never logged nor shown in errors.
    ``retry_timeout_ms``, ``retention_ms``: as :class:`JournalSettings`'.
    """

    def __init__(self, location: JournalLocation | str, *, fsync: bool = True,
                 options: Mapping[str, str] | Iterable[tuple[str, str]] = (),
                 content: Content = "offsets",
                 retry_timeout_ms: int = DEFAULT_RETRY_TIMEOUT_MS,
                 retention_ms: int = 0) -> None:
        self.location = location if isinstance(location, JournalLocation) \
            else JournalLocation.parse(location)
        self.uri = self.location.uri
        self.store, self.root = store_for(self.location, options,
                                          retry_timeout_ms=retry_timeout_ms)
        self.fsync = fsync
        self.content: Content = content
        self.retention_ms = retention_ms
        self.fence_retention_ms = 0  # what the fence promised when this object last read it
        self._kept = Retention()  # driver: committed batches kept, and plans (commit)
        # The newest fence this object read (it only grows): the lookup skips slot entries
        # at or below it without reading the fence again.
        self._fence_seen = -1
        self._marker: str | None = None  # the driver's marker this object checked
        # Scans of ended part logs by batch (driver: batch_ends, then commit, reads them once)
        self._ended: dict[int, dict[int, ScanResult]] = {}

    @classmethod
    def of(cls, settings: JournalSettings) -> Journal:
        """The journal ``settings`` describe."""
        return cls(settings.location, fsync=settings.fsync, options=settings.store_options,
                   content=settings.content, retry_timeout_ms=settings.retry_timeout_ms,
                   retention_ms=settings.retention_ms)

    def __repr__(self) -> str:
        return f"Journal({self.uri!r})"

    def _p(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def batch_dir(self, seq: int) -> str:
        """The directory (key prefix) of batch ``seq``'s part logs."""
        return self._p("batches", f"{seq:012d}")

    def part_log(self, seq: int, part: int) -> PartLog:
        return PartLog(self, seq, part)

    def _batch_names(self) -> list[str]:
        """Names of the batch directories, oldest first."""
        return sorted(n for n in self.store.listdir(self._p("batches")) if n.isdigit())

    def batches(self) -> list[int]:
        """The batches the journal still holds (uncommitted ones, and leftovers of committed
        ones until a sweep deletes them, ``retention_ms`` after their commit), oldest first."""
        return [int(n) for n in self._batch_names()]

    # -- the committed fence ------------------------------------------------------------

    def committed_seq(self) -> int:
        """The newest batch Spark committed (-1: none yet), read now."""
        return self.fence()[0]

    def fence(self) -> tuple[int, int]:
        """The fence, read now: the newest batch committed and the retention promised."""
        seq, self.fence_retention_ms = read_fence(self.store, self._p("committed"))
        self._fence_seen = max(self._fence_seen, seq)
        self._forget_committed_keys(seq)
        return seq, self.fence_retention_ms

    def claim(self, query_id: str) -> None:
        """Make ``query_id`` (Spark's streaming query id, stable across restarts) the journal's
        owner, or raise :class:`JournalError` if another query owns it."""
        if _CLAIMED.get(self.uri) == query_id:
            return
        run = ("owner", self.uri, query_id, self._marker) if self._marker else None
        if run is not None and host_checked(*run):
            _CLAIMED[self.uri] = query_id
            return
        self.store.makedirs(self.root)
        path = self._p("owner")
        for _ in range(MAX_CONFLICTS):
            # Read first: the owner exists but in a query's first moments, and a refused
            # create is a billed write on an object store where the read is a cheap GET.
            try:
                owner = self.store.read(path).decode()
            except FileNotFoundError:
                if self.store.create_exclusive(path, query_id.encode(), self.fsync):
                    break
                continue  # created by another process meanwhile (or a conflict): read it
            if owner != query_id:
                raise JournalError(
                    f"journalPath {self.uri!r} belongs to streaming query {owner}, not to this "
                    f"query ({query_id}). Give every query its own journal, like its "
                    "checkpoint; if the old query is gone for good, delete the directory")
            break
        else:
            raise JournalError(f"cannot create {path}: the store keeps reporting a conflict")
        _CLAIMED[self.uri] = query_id
        if run is not None:
            _note_host_check(*run)

    # -- one journal for the driver and every executor -----------------------------------

    def place_marker(self) -> str:
        """Leave a new marker for this run's tasks (driver); its name. Markers of runs older
        than a week are removed."""
        self.store.makedirs(self._p("markers"))
        if not self.store.create_exclusive(self._p(LAYOUT_FILE), LAYOUT, self.fsync) and \
                self.store.read(self._p(LAYOUT_FILE)).strip() != LAYOUT:
            raise JournalError(f"journal {self.uri} is of another layout (see load()'s check)")
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
        acknowledged; cached per process, and per host (:func:`host_checked`)."""
        self._marker = name
        if (self.uri, name) in _MARKERS_SEEN:
            return
        if host_checked("marker", self.uri, name):
            self._new_run(name)
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
        _note_host_check("marker", self.uri, name)
        self._new_run(name)

    def _new_run(self, name: str) -> None:
        """This process sees the run of marker ``name`` for the first time: what it cached
        may be stale (a deleted and reused directory)."""
        _MARKERS_SEEN.add((self.uri, name))
        _KEY_CACHE_FENCE.pop(self.uri, None)
        self._forget_keys(lambda _: True)

    def _forget_keys(self, stale: Callable[[str], bool]) -> None:
        """Drop this journal's cached slot keys whose path ``stale(path)`` says."""
        prefix = f"{self.uri}\0"
        with _KEY_CACHE_LOCK:
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
        keys = keys_of(self.store.read(path))
        self.remember(path, keys)
        return keys

    def remember(self, path: str, keys: SlotKeys) -> None:
        """Cache the keys of the slot at ``path`` (immutable once published): a part log
        notes each slot it publishes, so that the duplicate lookup never reads it back."""
        with _KEY_CACHE_LOCK:
            _KEY_CACHE[f"{self.uri}\0{path}"] = keys
            while len(_KEY_CACHE) > _KEY_CACHE_MAX:
                _KEY_CACHE.popitem(last=False)

    def index_slot(self, seq: int, part: int, slot: int, keys: SlotKeys) -> None:
        """Announce that slot ``slot`` of log ``(seq, part)`` will hold ``keys``: one index
        entry per topic-partition, each created before the slot is (a slot that exists is
        always found by the lookup; an entry whose slot was never created, or was won by
        another attempt, costs a read on overlap and holds nothing of ``keys``)."""
        for tp, offsets in keys.by_partition.items():
            if not len(offsets):
                continue
            entry = IndexEntry.covering(offsets, "s", seq, part, slot)
            path = self._p(tp_dir(tp), entry.name)
            try:
                self.store.makedirs(self._p(tp_dir(tp)))
                self.store.create_exclusive(path, b"", self.fsync)
            except JournalError:
                raise
            except OSError as exc:
                raise JournalError(f"cannot write journal index entry {path}: {exc}") from exc

    def _entry_path(self, tp: TopicPartition, entry: IndexEntry) -> str:
        """Where ``entry``'s keys are: its slot, or the dedup entry itself."""
        if entry.kind == "d":
            return self._p(tp_dir(tp), entry.name)
        return f"{self.batch_dir(entry.seq)}/{entry.part:05d}/{entry.slot:06d}"

    def find_journaled(self, candidates: set[Key] | SlotKeys) -> set[Key]:
        """Those of ``candidates`` that some published slot or dedup entry already holds.

        One listing per topic-partition of ``candidates``, from the lowest wanted offset, and
        a read only of an entry whose range overlaps them. Slot entries of batches at or
        below the newest fence this journal object has read are skipped (their unconfirmed
        keys are dedup entries, written before that fence, so listed too). A match in a slot
        is trusted only with a fence read *before* the listing (only that tells a late
        attempt's orphan from a published slot; docs/design.md, "The duplicate lookup"), so
        then the fence is read and the lookup made again: a read of the fence per lookup
        only when it finds something.
        """
        wanted = candidates if isinstance(candidates, SlotKeys) else SlotKeys.of(candidates)
        if not wanted.by_partition:
            return set()
        found, in_slot = self._lookup(wanted, self._fence_seen)
        if not in_slot:
            return found
        for _ in range(MAX_CONFLICTS):
            found, retry = self._lookup(wanted, self.committed_seq(), fresh=True)
            if not retry:
                return found
        raise JournalError(f"journal {self.uri}: batches kept being committed during a lookup")

    def _lookup(self, wanted: SlotKeys, fence: int, *,
                fresh: bool = False) -> tuple[set[Key], bool]:
        """The keys of ``wanted`` the index's entries hold (slot entries above ``fence``), and
        a flag: not ``fresh``, a slot matched or vanished (look again with the fence read
        first); ``fresh``, a slot vanished from a batch committed meanwhile (look again)."""
        found: set[Key] = set()
        for tp, offsets in wanted.by_partition.items():
            if not len(offsets):
                continue
            names = self.store.list_after(self._p(tp_dir(tp)), after(int(offsets[0])))
            for entry in overlapping(names, offsets):
                if entry.kind == "s" and entry.seq <= fence:
                    continue
                try:
                    held = self._slot_keys(self._entry_path(tp, entry)).by_partition.get(tp)
                except FileNotFoundError:
                    if entry.kind == "d":
                        continue  # pruned: below the start offset, or expired
                    if not fresh:
                        return found, True  # maybe committed since: look with the fence
                    if self.committed_seq() >= entry.seq:
                        return found, True  # committed and deleted: its dedup entries now
                    continue  # never created (announced only) in an open batch
                if held is None:
                    continue
                hit = offsets[np.isin(offsets, held, assume_unique=True)]
                if len(hit) and entry.kind == "s" and not fresh:
                    return found, True
                found.update((tp.topic, tp.partition, o) for o in hit.tolist())
        return found, False

    # -- driver side --------------------------------------------------------------------

    def batch_ends(self, seq: int) -> dict[int, EndMarker]:
        """END markers of batch ``seq``, by partition (their stats with the records replays
        after END skipped, ``records_lost``)."""
        ends: dict[int, EndMarker] = {}
        for part, names in self._batch_listing(seq).items():
            log = self.part_log(seq, part)
            try:
                scan = log.scan(names)
                end = scan.end
                lost = log.losses() if end is not None and log.loss_files else 0
            except JournalClosed:
                continue  # committed and deleted meanwhile
            if end is not None:
                # Nothing is published after END: commit reuses the scan.
                self._ended.setdefault(seq, {})[part] = scan
                if lost:  # skipped by replays after END: counted with the batch
                    end = replace(end, stats={**end.stats, "records_lost":
                                              end.stats.get("records_lost", 0) + lost})
                ends[int(part)] = end
        return ends

    def commit(self, seq: int, dedup_retention_ms: int,
               start_offsets: Mapping[TopicPartition, int] | None = None,
               parts: int = 0) -> None:
        """Batch ``seq`` is committed by Spark: close its logs, keep dedup keys, fence it;
        delete committed batches ``retention_ms`` after their commit.

        Order matters. Every log of each newly committed batch gets END (``parts``: the
        batch's tasks, whose logs may not exist yet), then dedup entries (``find_journaled``
        skips fenced batches), then the fence. A log without END at the commit is one whose
        task Spark did not run to its end (a ``take()`` in ``foreachBatch``); closing it
        makes every later create in the batch's logs find its slot taken until the batch is
        deleted, which is what lets a young attempt skip the fence re-read
        (:meth:`PartLog.fence_holds`).

        Dedup entries are written only for batches above the previous fence. A batch at or
        below it was committed before, with its entries; whatever is in it now was written by
        a late attempt after it was deleted, was never acknowledged, and is only deleted
        here: taking its records for published ones would drop their redeliveries.
        """
        previous = self.committed_seq()
        # Listed only at a driver's first commit and after a skipped one: otherwise only
        # ``seq`` is closed, and the sweep finds any other (an orphan, an earlier run's).
        listed = [] if self._kept.swept_at is not None and seq <= previous + 1 else \
            [int(n) for n in self._batch_names()]
        fresh = self._kept.to_close(previous, seq, listed)
        for done in fresh:
            self._keep_unconfirmed(done, self._close_logs(done,
                                                          self._kept.tasks_of(done, seq, parts)))
        if seq > previous:
            raise_fence(self.store, self._p("committed"), seq, self._keep_ms())
        self._kept.fenced(  # timed after the fence write: no earlier than the commit
            [n for n in listed if n <= seq] + fresh, clock(), seq)
        for done in [n for n in self._ended if n <= seq]:
            del self._ended[done]
        self._sweep(max(seq, previous), start_offsets, dedup_retention_ms)

    def planned(self, seq: int, parts: int) -> None:
        """Batch ``seq`` runs ``parts`` tasks (the driver, when Spark asks for its
        partitions): its commit closes that many logs, even after a skipped commit."""
        self._kept.planned[seq] = parts

    def _keep_ms(self) -> int:
        """How long committed batches are kept: this driver's retention or the fence's promise."""
        return max(self.retention_ms, self.fence_retention_ms)

    def _close_logs(self, seq: int, parts: int) -> dict[int, ScanResult]:
        """END every log of batch ``seq`` (``0 .. parts - 1`` and any listed) that has none;
        the final scan of each. Free where :meth:`batch_ends` saw every task's END; else a
        listing of the batch, and per open log a read of its last slot and one create."""
        scans = dict(self._ended.get(seq, {}))
        if scans.keys() >= set(range(parts)) and parts > 0:
            return scans
        listing = self._batch_listing(seq)
        for part in sorted(set(range(parts)) | listing.keys()):
            if part in scans:
                continue
            log = self.part_log(seq, part)
            scan = log.scan(listing.get(part, []))
            if part not in listing:
                self.store.makedirs(log.dir)  # a task that never ran: END at slot 0
            if scan.end is None:
                scan = log.end(lambda s: EndMarker(attempt=-1, data_slots=len(s.data_slots),
                                                   records=0, stats={"closed_at_commit": 1}))
            scans[part] = scan
        return scans

    def _sweep(self, fence: int, start_offsets: Mapping[TopicPartition, int] | None,
               dedup_retention_ms: int) -> None:
        """Delete the committed batches fenced ``retention_ms`` ago or more, the index
        entries of fenced batches and the dedup entries that can no longer match; at most
        every ``retention_ms / 2`` (with 0, at every commit), in one listing and one bulk
        delete per thousand keys on an object store."""
        now, keep_ms = clock(), self._keep_ms()
        if not self._kept.sweep_due(now, keep_ms):
            return
        names = self.store.listdir(self._p("batches")) if self.store.renames else \
            self.store.files_under(self._p("batches"))
        found = {n for n in map(batch_of, names) if n is not None}
        delete_batches(self.store, self._p("batches"), names,
                       self._kept.expired(found, fence, now, keep_ms))
        self._clean_index(fence, start_offsets, dedup_retention_ms)

    def _batch_listing(self, seq: int) -> dict[int, list[str]]:
        """The file names of each part log of batch ``seq``, from one recursive listing."""
        logs: dict[int, list[str]] = {}
        for rel in self.store.files_under(self.batch_dir(seq)):
            part, _, name = rel.partition("/")
            if part.isdigit() and name and "/" not in name:
                logs.setdefault(int(part), []).append(name)
        return logs

    def _keep_unconfirmed(self, seq: int, scans: Mapping[int, ScanResult]) -> None:
        """Write a dedup entry per topic-partition for every slot of batch ``seq`` whose
        acknowledgement its END does not record as confirmed (``scans``: the final scan of
        each of its logs)."""
        for part, scan in scans.items():
            log = self.part_log(seq, part)
            acked = set(scan.end.acked_slots) if scan.end else set()
            for slot in scan.data_slots:
                if slot in acked:
                    continue  # acknowledged and confirmed: never redelivered
                self.add_dedup(seq, part, slot, self._slot_keys(log.slot_path(slot)))

    def add_dedup(self, seq: int, part: int, slot: int, keys: SlotKeys) -> None:
        """Keep ``keys`` (of slot ``slot`` of log ``(seq, part)``) as dedup entries, one per
        topic-partition, under that topic-partition's prefix of the index."""
        for tp, offsets in keys.by_partition.items():
            if not len(offsets):
                continue
            entry = IndexEntry.covering(offsets, "d", seq, part, slot)
            self.store.makedirs(self._p(tp_dir(tp)))
            self.store.create_exclusive(self._p(tp_dir(tp), entry.name),
                                        dedup_entry(SlotKeys({tp: offsets})), self.fsync)

    def dedup_entries(self) -> list[IndexEntry]:
        """The dedup entries (one per slot and topic-partition)."""
        return [entry for _, entry in self._index_entries() if entry.kind == "d"]

    def _index_entries(self) -> list[tuple[str, IndexEntry]]:
        """Every entry of the index, with its path relative to ``index/`` (one listing)."""
        found: list[tuple[str, IndexEntry]] = []
        for rel in self.store.files_under(self._p(INDEX_DIR)):
            entry = IndexEntry.parse(rel.rsplit("/", 1)[-1])
            if entry is not None and rel.count("/") == 2:
                found.append((rel, entry))
        return found

    def _clean_index(self, fence: int, start_offsets: Mapping[TopicPartition, int] | None,
                     retention_ms: int) -> None:
        """Delete the slot entries of batches at or below ``fence`` and the dedup entries
        that can no longer match a redelivery (:meth:`prune_dedup`)."""
        self.store.remove_all([
            self._p(INDEX_DIR, rel) for rel, entry in self._index_entries()
            if (entry.kind == "s" and entry.seq <= fence) or
            (entry.kind == "d" and self._expired(rel, entry, start_offsets, retention_ms))])

    def prune_dedup(self, start_offsets: Mapping[TopicPartition, int] | None,
                    retention_ms: int) -> None:
        """Drop dedup entries that can no longer match a redelivery.

        With the group's share-partition start offsets (per topic-partition), an
        entry goes once all its records are below them: records there are acknowledged or
        archived for good and are never delivered again. That bound is exact, so the time
        limit ``retention_ms`` applies only when the start offsets could not be read.
        """
        self.store.remove_all([self._p(INDEX_DIR, rel) for rel, entry in self._index_entries()
                               if entry.kind == "d"
                               and self._expired(rel, entry, start_offsets, retention_ms)])

    def _expired(self, rel: str, entry: IndexEntry,
                 start_offsets: Mapping[TopicPartition, int] | None, retention_ms: int) -> bool:
        """Whether dedup entry ``entry`` (at ``index/<rel>``) can go: its highest offset (in
        its name) is below its topic-partition's start offset, or, without start offsets,
        it is older than ``retention_ms``."""
        if start_offsets is not None:
            topic, partition, _ = rel.split("/")
            return entry.hi < start_offsets.get(TopicPartition(topic, int(partition)), -1)
        try:
            return retention_ms > 0 and \
                self.store.mtime(self._p(INDEX_DIR, rel)) < time.time() - retention_ms / 1000
        except FileNotFoundError:
            return False
