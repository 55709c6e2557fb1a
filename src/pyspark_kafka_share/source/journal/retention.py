"""The driver's keeping of committed batches: which batches a commit closes, how many tasks
each ran, when each was fenced, and which a sweep deletes (``journalRetentionMs``).

A committed batch is deleted no earlier than the retention after its fence, so that a task
younger than half of it may skip the fence re-read after its slot's create
(``PartLog.fence_holds``; docs/design.md, "The fence re-read and the retention of committed
batches"). Times are on :func:`.fencing.clock`; this module only counts, the journal makes
the requests.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark_kafka_share.source.journal.stores import Store

__all__ = ["UNLISTED_CLOSED", "Retention", "batch_of", "delete_batches"]

UNLISTED_CLOSED = 16
"""Batches a commit after a skipped one closes even where none is listed (an object store
lists no batch whose tasks created nothing)."""


def batch_of(name: str) -> int | None:
    """The batch a name listed under ``batches/`` belongs to (``<seq>`` or ``<seq>/...``),
    or None for anything else (a renamed-aside ``.gc-`` directory)."""
    top = name.split("/", 1)[0]
    return int(top) if top.isdigit() else None


class Retention:
    """What one driver ``Journal`` knows of committed batches: when it first knew each fenced
    (its clock), when it last swept, and the tasks of each batch it planned."""

    def __init__(self) -> None:
        self.fenced_at: dict[int, float] = {}
        self.swept_at: float | None = None
        self.planned: dict[int, int] = {}

    def to_close(self, previous: int, seq: int, listed: Iterable[int]) -> list[int]:
        """The batches a commit of ``seq`` over the fence ``previous`` closes: ``seq``, and
        after a skipped commit the listed ones above the fence and, where a fence exists, the
        last :data:`UNLISTED_CLOSED`, listed or not (without a fence no task skips its
        re-read: ``PartLog.fence_holds``)."""
        recent = range(max(previous + 1, seq - UNLISTED_CLOSED + 1), seq) if previous >= 0 \
            else range(0)
        return sorted({n for n in listed if previous < n <= seq} | set(recent) |
                      ({seq} if seq > previous else set()))

    def tasks_of(self, batch: int, seq: int, parts: int) -> int:
        """The tasks of ``batch`` when the commit of ``seq`` (``parts`` tasks) closes it: its
        own plan's, or for a batch a run before a restart planned, as many as the widest
        batch known."""
        if batch == seq:
            return parts
        return self.planned.get(batch, max([parts, *self.planned.values()]))

    def fenced(self, batches: Iterable[int], now: float, seq: int) -> None:
        """Note ``batches`` fenced at ``now`` (unless known), and forget the plans up to
        ``seq``."""
        for batch in batches:
            self.fenced_at.setdefault(batch, now)
        for batch in [n for n in self.planned if n <= seq]:
            del self.planned[batch]

    def sweep_due(self, now: float, keep_ms: int) -> bool:
        """Whether a sweep runs now (at most every half of ``keep_ms``); notes it."""
        if self.swept_at is not None and (now - self.swept_at) * 1000 < keep_ms / 2:
            return False
        self.swept_at = now
        return True

    def expired(self, found: Iterable[int], fence: int, now: float, keep_ms: int) -> set[int]:
        """The batches to delete now (fenced ``keep_ms`` ago or more), forgotten here;
        ``found``: the batches the store holds, those at or below ``fence`` that this object
        did not fence (an earlier run's, a late attempt's orphan) noted as fenced now."""
        for batch in found:
            if batch <= fence:
                self.fenced_at.setdefault(batch, now)
        gone = {n for n, at in self.fenced_at.items() if (now - at) * 1000 >= keep_ms}
        for batch in gone:
            del self.fenced_at[batch]
        return gone


def delete_batches(store: Store, batches_dir: str, names: list[str], gone: set[int]) -> None:
    """Delete the batches ``gone`` under ``batches_dir``, whose listing is ``names``: on a
    filesystem (``store.renames``) each directory renamed aside first (a late attempt's link
    into the old path then fails), with leftovers of earlier renames; on an object store
    ``names`` are every key below, deleted in bulk (1,000 a request)."""
    if store.renames:
        for batch in sorted(gone):
            store.remove_tree(store.retire(f"{batches_dir}/{batch:012d}"))
        for name in names:
            if name.startswith(".gc-"):
                store.remove_tree(f"{batches_dir}/{name}")
        return
    store.remove_all([f"{batches_dir}/{rel}" for rel in names if batch_of(rel) in gone])
