"""Who may write: exclusive slots, END, and the ``committed`` fence.

Every slot is created *exclusively*: of all attempts that try to create slot ``n`` exactly one
succeeds. An attempt appends its records at the first free slot; if the slot it finds taken is
an END marker, the partition is closed and it releases its records instead. A partition's
output is the data slots before its first END, so every attempt that returns yields the same
rows, and nothing is ever published after END. Slots are contiguous and END is the last one,
so a log's state is known from one listing plus the first bytes of its last slot.

Exclusive create is ``link(2)`` on a local or mounted filesystem, ``rename`` on HDFS, and a
conditional put on S3, GCS and Azure (see :mod:`.stores`). ``Journal.commit`` ENDs every log of
the batch that has no END yet before it raises the ``committed`` fence, and deletes a committed
batch's slots only after the retention the fence promises (the largest ``retention_ms`` any
driver gave): until then every create in its logs finds its slot taken (slots are contiguous up
to END, and no slot is ever deleted alone), so a slot an attempt created within half of the
smaller of its own ``retention_ms`` and the promise of its fence read at ``open`` (which found
the batch uncommitted; 0 without a fence) was created before the commit and is part of the
batch (:meth:`PartLog.fence_holds`).
An older attempt re-reads the fence after each create and gives its records back if the batch
was committed meanwhile; ``Journal.commit`` writes de-duplication keys only for batches above
the previous fence, so such a slot is never taken for published data. See ``docs/design.md``
("The fence re-read and the retention of committed batches").

A :class:`PartLog` knows its journal only through :class:`LogJournal`, the few public members
it needs (``Journal`` provides them); this module does not import the journal.
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from pyspark_kafka_share.errors import JournalClosed, JournalError
from pyspark_kafka_share.source.journal.keys import SlotKeys
from pyspark_kafka_share.source.journal.slots import (
    ARROW_MAGIC,
    LOSS_PREFIX,
    Content,
    EndMarker,
    OffsetSlot,
    attempt_of,
    data_slot,
    is_data,
    offsets_slot,
    read_slot,
)
from pyspark_kafka_share.source.journal.stores import Store

__all__ = ["HEAD_BYTES", "MAX_CONFLICTS", "LogJournal", "PartLog", "ScanResult", "raise_fence",
           "read_fence"]

# Give up on a slot after this many "exists" answers for an object that cannot be read.
MAX_CONFLICTS = 50
HEAD_BYTES = 64 << 10
"""What a scan reads of a log's last slot (one ranged GET): an END marker whole, or the start
of a data slot (its first bytes say which: ``ARROW1`` or ``{``)."""


def clock() -> float:
    """Seconds on a clock that keeps counting while the machine sleeps or the process is
    stopped (``CLOCK_BOOTTIME`` on Linux; elsewhere ``time.monotonic``, which may not count a
    sleeping machine). :meth:`PartLog.fence_holds` takes the larger of its age on this clock
    and on the wall clock, which a paused virtual machine's time sync moves on at resume."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    return time.monotonic()


def read_fence(store: Store, path: str) -> tuple[int, int]:
    """The fence file at ``path``: the newest batch Spark committed (-1: none yet) and the
    retention the journal's drivers promised (the largest ``journalRetentionMs`` any gave it;
    0 in a fence without one)."""
    try:
        doc = json.loads(store.read(path))
        return int(doc["seq"]), int(doc.get("retention_ms", 0))
    except FileNotFoundError:
        return -1, 0
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise JournalError(f"cannot read {path}: {exc}") from exc


def raise_fence(store: Store, path: str, seq: int, retention_ms: int) -> None:
    """Move the fence at ``path`` up to batch ``seq`` (an atomic overwrite), promising that
    no committed batch is deleted before ``retention_ms`` after its commit."""
    store.write(path, json.dumps({"seq": seq, "retention_ms": retention_ms}).encode())


class LogJournal(Protocol):
    """What a :class:`PartLog` needs of its journal."""

    @property
    def uri(self) -> str:
        """The journal's ``journalPath`` (for messages and per-journal caches)."""

    @property
    def store(self) -> Store: ...

    @property
    def fsync(self) -> bool: ...

    @property
    def content(self) -> Content:
        """What a new data slot holds."""

    @property
    def retention_ms(self) -> int:
        """How long the driver keeps a committed batch's slots (``journalRetentionMs``; 0:
        deleted at the commit)."""

    def fence(self) -> tuple[int, int]:
        """The fence, read now: the newest batch committed and the retention promised."""

    def committed_seq(self) -> int:
        """The newest batch Spark committed (-1: none yet)."""

    def batch_dir(self, seq: int) -> str:
        """The directory (key prefix) of batch ``seq``'s part logs."""

    def index_slot(self, seq: int, part: int, slot: int, keys: SlotKeys) -> None:
        """Announce, before creating it, that slot ``slot`` of log ``(seq, part)`` will hold
        ``keys`` (the duplicate lookup's index)."""

    def remember(self, path: str, keys: SlotKeys) -> None:
        """Note the keys of the slot just published at ``path`` (the duplicate lookup's
        cache), so that this process never reads them back."""


@dataclass
class ScanResult:
    data_slots: list[int]
    end: EndMarker | None
    next_slot: int


class PartLog:
    """The slot log of one input partition of one batch."""

    def __init__(self, journal: LogJournal, seq: int, part: int) -> None:
        self.journal = journal
        self.seq = seq
        self.part = part
        self.dir = f"{journal.batch_dir(seq)}/{part:05d}"
        self._next = 0
        # _next is the first free slot as far as this object knows: it scanned the log (and
        # found no END) or appended to it. END is then tried there first (``end``).
        self._next_known = False
        self.loss_files: list[str] = []  # seen by the last scan
        self.last_slot_bytes = 0  # size of the last data slot this log appended
        # clock() and the wall clock before open()'s fence read, and the retention both the
        # task and the fence then promised (fence_holds)
        self.opened_at: tuple[float, float] | None = None
        self._window_ms = 0

    def slot_path(self, slot: int) -> str:
        return f"{self.dir}/{slot:06d}"

    def open(self) -> ScanResult:
        """Create the directory, then check the fence (in this order; see docs/design.md),
        then scan the log: one ranged read of slot 0 first, which misses in an empty log
        (slots are contiguous from 0), so that a first attempt's open costs two reads and no
        listing (S3 bills a LIST as a write, a GET at a twelfth of that)."""
        self.journal.store.makedirs(self.dir)
        self.opened_at = (clock(), time.time())
        fence, promised_ms = self.journal.fence()
        if fence >= self.seq:
            raise JournalClosed(f"batch {self.seq} is already committed")
        self._window_ms = min(self.journal.retention_ms, promised_ms)
        try:
            self.journal.store.read_head(self.slot_path(0), len(ARROW_MAGIC))
        except FileNotFoundError:
            self.loss_files = []
            self._next, self._next_known = 0, True
            return ScanResult([], None, 0)
        except OSError as exc:
            raise JournalError(f"cannot read {self.slot_path(0)}: {exc}") from exc
        return self.scan()

    def scan(self, names: list[str] | None = None) -> ScanResult:
        """The log's data slots, END marker and first free slot.

        ``names``: the log's file names, when the caller listed them already (the driver
        lists a whole batch at once); else the log is listed here.
        Reads one listing and the first bytes of the last slot only (one ranged GET, END
        included): slots are contiguous from 0 (each is created only by an attempt that found
        the one before taken) and END, if any, is the last (an attempt that finds a slot
        taken by END stops). Raises
        :class:`JournalClosed` if that slot vanished (its batch was committed and deleted).
        """
        store = self.journal.store
        if names is None:
            names = store.listdir(self.dir)
        numbers = sorted(int(n) for n in names if n.isdigit())
        self.loss_files = [n for n in names if n.startswith(LOSS_PREFIX)]
        count = 0
        for number in numbers:
            if number != count:
                break  # a gap: only in a committed batch being deleted; stop there
            count += 1
        if count == 0:
            self._next, self._next_known = 0, True
            return ScanResult([], None, 0)
        last = count - 1
        try:
            end = self._end_at(last)
        except FileNotFoundError as exc:
            raise JournalClosed(f"batch {self.seq} was committed meanwhile") from exc
        if end is None:
            self._next, self._next_known = count, True
            return ScanResult(list(range(count)), None, count)
        self._next, self._next_known = last, False
        return ScanResult(list(range(last)), end, last)

    def _end_at(self, slot: int) -> EndMarker | None:
        """The END marker at ``slot``, or None for a data slot: one ranged GET of its first
        :data:`HEAD_BYTES` (an END marker is a few hundred bytes, so that is all of it; only
        a larger one is read again whole)."""
        store = self.journal.store
        head = store.read_head(self.slot_path(slot), HEAD_BYTES)
        if is_data(head):
            return None
        if len(head) < HEAD_BYTES:
            return EndMarker.from_bytes(head)
        return EndMarker.from_bytes(store.read(self.slot_path(slot)))

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

        The slot records ``attempt`` (the writing task attempt) and holds what the journal's
        ``content`` says (the records, or their offsets and checksum); ``keys`` are the
        batch's, if the caller has them already. Raises :class:`JournalClosed` if the log was
        ENDed first (nothing was published).
        """
        payload = offsets_slot(batch, attempt) if self.journal.content == "offsets" \
            else data_slot(batch, attempt)
        self.last_slot_bytes = len(payload)
        keys = keys if keys is not None else SlotKeys.of_table(batch)
        conflicts = 0
        announced = -1
        while True:
            slot = self._next
            if slot != announced:  # the index names a slot before it exists
                self.journal.index_slot(self.seq, self.part, slot, keys)
                announced = slot
            if self._create(slot, payload):
                return self._published(slot, keys)
            self._next_known = False  # until a create succeeds: the slot may hold END
            try:
                taken = self.journal.store.read(self.slot_path(slot))
            except FileNotFoundError:
                # Reported as existing, yet absent: S3's 409 for a conditional write still in
                # flight elsewhere, or a slot deleted meanwhile. Try the same slot again.
                conflicts += 1
                if conflicts >= MAX_CONFLICTS:
                    raise JournalError(f"cannot create journal slot {self.slot_path(slot)}: "
                                       "the store keeps reporting a conflict") from None
                time.sleep(min(0.01 * conflicts, 0.2))
                continue
            self._next = slot + 1
            if taken == payload:
                # Our own create, retried by the filesystem client (NFS, HDFS failover, an
                # object store's retry, the journal's own after an outage) and reported as
                # "exists": the payload names this attempt, so it is ours, a create that
                # answered (made before this answer, all that fence_holds needs).
                return self._published(slot, keys)
            if not is_data(taken):
                raise JournalClosed(f"partition {self.part} of batch {self.seq} is closed")

    def _published(self, slot: int, keys: SlotKeys) -> int:
        """Note that our data slot ``slot`` (holding ``keys``) exists; return its number."""
        self._next, self._next_known = slot + 1, True
        self.journal.remember(self.slot_path(slot), keys)
        return slot

    def fence_holds(self) -> bool:
        """Whether a slot this object has just created (its create answered) is known to
        precede its batch's commit without reading the fence again: it was opened (the fence
        read that found the batch uncommitted) less than half of *R* ago, *R* the smaller of
        the task's ``retention_ms`` and what that fence promised (0 without a fence).

        The commit came after that read, so the driver deletes the batch's slots no earlier
        than *R* after it (a driver keeps the largest retention the fence ever promised);
        until then a create in a committed log finds its slot taken (the driver ENDed every
        log before the fence; slots are contiguous up to END and none is deleted alone). A
        create that answered within half of that was therefore made before the commit, in
        the log before END: the batch's output holds it. The other half is a margin for the
        clocks' rates. docs/design.md ("The fence re-read and the retention of committed
        batches")."""
        if self.opened_at is None:
            return False
        age_s = max(clock() - self.opened_at[0], time.time() - self.opened_at[1])
        return age_s * 1000 < self._window_ms / 2

    def end(self, marker_for: Callable[[ScanResult], EndMarker]) -> ScanResult:
        """Close the log with an END marker (``marker_for(scan) -> EndMarker``); return the
        final scan. If another attempt ENDed first, its marker stands.

        Where this object knows the first free slot (it scanned or appended), END is created
        there without listing the log: one request. If that slot is taken (another attempt
        appended or ENDed meanwhile), the log is scanned and END goes to its first free slot,
        as before. Why the shortcut needs no fence read: docs/design.md ("What a task and a
        batch cost").
        """
        if self._next_known:
            known = ScanResult(list(range(self._next)), None, self._next)
            marker = marker_for(known)
            if self._create(known.next_slot, marker.to_bytes()):
                self._next_known = False
                return ScanResult(known.data_slots, marker, known.next_slot)
        for attempt in range(MAX_CONFLICTS):
            scan = self.scan()
            if scan.end is not None:
                return scan
            marker = marker_for(scan)
            if self._create(scan.next_slot, marker.to_bytes()):
                return ScanResult(scan.data_slots, marker, scan.next_slot)
            time.sleep(min(0.01 * attempt, 0.2))  # lost the slot: look again
        raise JournalError(f"cannot END journal log {self.dir}: the store keeps reporting a "
                           "conflict")

    def losses(self) -> int:
        """Records that replays after END skipped (``failOnDataLoss=false``), from the files
        the last :meth:`scan` saw."""
        lost = 0
        for name in self.loss_files:
            try:
                lost += int(json.loads(self.journal.store.read(f"{self.dir}/{name}"))
                            .get("records_lost", 0))
            except (FileNotFoundError, ValueError):
                continue
        return lost

    def writer(self, slot: int) -> int:
        """The task attempt that published data slot ``slot``."""
        return attempt_of(self.journal.store.read(self.slot_path(slot)))

    def slot(self, slot: int) -> pa.Table | OffsetSlot:
        """Data slot ``slot`` as written: the records of a ``records`` slot, or an
        :class:`OffsetSlot` (whose records a replay reads from Kafka)."""
        return read_slot(self.journal.store.read(self.slot_path(slot)))

    def identities(self, slot: int) -> pa.Table:
        """``(topic, partition, offset)`` of data slot ``slot``'s rows, in row order, for either
        content (no Kafka read)."""
        held = self.slot(slot)
        if not isinstance(held, OffsetSlot):
            return held.select(["topic", "partition", "offset"])
        tps, which, offsets, _ = held.rows_in_order()
        return pa.table({
            "topic": pa.array([tps[i].topic for i in which.tolist()], pa.string()),
            "partition": pa.array([tps[i].partition for i in which.tolist()], pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
        })
