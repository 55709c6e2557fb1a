"""The journal's index: which slots and dedup entries can hold a given record.

Every slot is announced before it is created, and every dedup entry is written, as one object
per topic-partition it holds, under that topic-partition's own prefix, whose *name* says what
it covers::

    index/<topic>/<partition>/<hi>-<lo>-s-<seq>-<part>-<slot>   slot <slot> of log (seq, part)
                                                               holds offsets in [lo, hi]
                                                               (empty object; its keys are
                                                               in the slot)
    index/<topic>/<partition>/<hi>-<lo>-d-<seq>-<part>-<slot>   a dedup entry: that slot's
                                                               unacknowledged keys of this
                                                               topic-partition

``hi`` and ``lo`` are zero-padded, ``hi`` first, so the names sort by their highest offset
and one listing that starts after ``lowest wanted - 1`` returns exactly the entries whose
range can reach the wanted offsets (``Store.list_after``: S3's ``start-after``). The
duplicate lookup reads an entry's object (or its slot) only when its range overlaps the
poll's offsets of that topic-partition. No request depends on how many tasks or processes
write the journal. The completeness argument is in docs/design.md ("The duplicate lookup").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share.source.journal.keys import Offsets

__all__ = ["INDEX_DIR", "LAYOUT", "LAYOUT_FILE", "IndexEntry", "after", "overlapping", "tp_dir"]

INDEX_DIR = "index"
LAYOUT_FILE = "layout"
LAYOUT = b"index-1"
"""What ``<journalPath>/layout`` holds in a journal of this layout (the driver writes it). A
journal without it that holds batches, dedup entries or a fence is of the layout before the
index (every slot read by every process), which this version cannot search: refused at
``load()`` (``probe.check_layout``)."""
_WIDTH = 19  # digits of an int64 offset
_NAME = re.compile(r"([0-9]{19})-([0-9]{19})-([sd])-([0-9]+)-([0-9]+)-([0-9]+)")


def tp_dir(tp: TopicPartition) -> str:
    """The prefix (relative to the journal) of ``tp``'s index entries."""
    return f"{INDEX_DIR}/{tp.topic}/{tp.partition:05d}"


def after(lowest: int) -> str:
    """The ``start-after`` name that lists the entries whose highest offset is ≥ ``lowest``."""
    return f"{lowest - 1:0{_WIDTH}d}~" if lowest > 0 else ""


@dataclass(frozen=True)
class IndexEntry:
    """One index entry: a slot (``kind`` "s") or dedup entry ("d") holding offsets of one
    topic-partition in ``[lo, hi]``."""

    lo: int
    hi: int
    kind: str
    seq: int
    part: int
    slot: int

    @property
    def name(self) -> str:
        return (f"{self.hi:0{_WIDTH}d}-{self.lo:0{_WIDTH}d}-{self.kind}-{self.seq:012d}-"
                f"{self.part:05d}-{self.slot:06d}")

    @classmethod
    def parse(cls, name: str) -> IndexEntry | None:
        """The entry named ``name``, or None (a temporary file, anything else)."""
        m = _NAME.fullmatch(name)
        if m is None:
            return None
        return cls(int(m[2]), int(m[1]), m[3], int(m[4]), int(m[5]), int(m[6]))

    @classmethod
    def covering(cls, offsets: Offsets, kind: str, seq: int, part: int,
                 slot: int) -> IndexEntry:
        """The entry for sorted ``offsets`` of one topic-partition."""
        return cls(int(offsets[0]), int(offsets[-1]), kind, seq, part, slot)


def overlapping(names: list[str], offsets: Offsets) -> list[IndexEntry]:
    """The entries among ``names`` whose range holds one of the sorted ``offsets`` at least
    (a range check per entry: which offsets fall in ``[lo, hi]``)."""
    found: list[IndexEntry] = []
    for name in names:
        entry = IndexEntry.parse(name)
        if entry is None:
            continue
        first = int(np.searchsorted(offsets, entry.lo))
        if first < len(offsets) and offsets[first] <= entry.hi:
            found.append(entry)
    return found
