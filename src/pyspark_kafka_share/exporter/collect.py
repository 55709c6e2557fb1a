"""What ``kafka-share exporter`` reads from the cluster: one :class:`Snapshot` per collection,
through :class:`~pyspark_kafka_share.admin.ShareGroupAdmin` (the numbers ``kafka-share groups
describe`` and ``lag`` print). Plain data: no Prometheus here (:mod:`.serve` renders it).

In-flight (acquired, not yet acknowledged) record counts are not in Kafka's admin API
(DescribeShareGroupOffsets reports a start offset and a lag only), so they are not collected.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark_kafka_share.errors import (
    GroupNotFoundError,
    LagUnavailableError,
    NotAShareGroupError,
    UnknownTopicError,
)

if TYPE_CHECKING:
    from pyspark_kafka_share.admin import GroupDescription, PartitionOffset, ShareGroupAdmin

__all__ = ["NOT_FOUND", "GroupReader", "GroupSnapshot", "PartitionRow", "Snapshot", "collect",
           "collect_group"]

NOT_FOUND = "NotFound"
"""The state reported for a watched group that does not exist (the broker has no such state:
a job not started yet, or a group deleted)."""


@dataclass(frozen=True)
class PartitionRow:
    """A partition the group has share state for or members assigned to."""

    topic: str
    partition: int
    start_offset: int | None  # None: no share state yet
    lag: int | None  # None: unknown (no member fetched yet, or the broker predates lag)
    assigned_members: int


@dataclass(frozen=True)
class GroupSnapshot:
    """One share group as the broker described it."""

    group: str
    state: str  # Stable, Empty, Dead, ... or NOT_FOUND
    members: int
    partitions: tuple[PartitionRow, ...]
    dead_letter_ends: tuple[tuple[str, int, int], ...]  # (topic, partition, end offset)

    @property
    def total_lag(self) -> int:
        """The sum of the known lags (``kafka-share groups lag``'s TOTAL-LAG)."""
        return sum(p.lag for p in self.partitions if p.lag is not None)

    @property
    def unknown_lag_partitions(self) -> int:
        return sum(1 for p in self.partitions if p.lag is None)


@dataclass(frozen=True)
class Snapshot:
    """Every watched group, as of one collection."""

    groups: tuple[GroupSnapshot, ...]


def _rows(desc: GroupDescription, offsets: Sequence[PartitionOffset],
          lag_reported: bool) -> tuple[PartitionRow, ...]:
    assigned: dict[tuple[str, int], int] = {}
    for member in desc.members:
        for topic, partitions in member.assignment.items():
            for p in partitions:
                assigned[(topic, p)] = assigned.get((topic, p), 0) + 1
    known = {(o.topic, o.partition): o for o in offsets}
    rows = []
    for key in sorted(set(known) | set(assigned)):
        o = known.get(key)
        rows.append(PartitionRow(key[0], key[1], None if o is None else o.start_offset,
                                 None if o is None or not lag_reported else o.lag,
                                 assigned.get(key, 0)))
    return tuple(rows)


def _dead_letter_topic(admin: ShareGroupAdmin, group: str, given: str | None) -> str | None:
    """The group's dead-letter topic: the one given (the workers' ``dead_letter_topic``), else
    the broker's dead-letter queue when it is on (Kafka 4.4+), else none."""
    if given:
        return given
    dlq = admin.dead_letter_queue(group)
    return dlq.topic if dlq.active else None


def _dead_letter_ends(admin: ShareGroupAdmin,
                      topic: str | None) -> tuple[tuple[str, int, int], ...]:
    if not topic:
        return ()
    try:
        ends = admin.end_offsets([topic])
    except UnknownTopicError:
        return ()  # not created yet: nothing dead-lettered
    return tuple((t, p, o) for t, parts in sorted(ends.items()) for p, o in sorted(parts.items()))


def collect_group(admin: ShareGroupAdmin, group: str,
                  dead_letter_topic: str | None = None) -> GroupSnapshot:
    """One group's snapshot; an unknown group is :data:`NOT_FOUND` (a group of another type
    raises :class:`~pyspark_kafka_share.errors.NotAShareGroupError`)."""
    try:
        desc = admin.describe(group)
    except NotAShareGroupError:
        raise
    except GroupNotFoundError:
        return GroupSnapshot(group, NOT_FOUND, 0, (), ())
    offsets = admin.offsets(group)
    try:
        admin.total_lag(group, offsets)
        lag_reported = True
    except LagUnavailableError:
        lag_reported = False
    ends = _dead_letter_ends(admin, _dead_letter_topic(admin, group, dead_letter_topic))
    return GroupSnapshot(group, desc.state, len(desc.members),
                         _rows(desc, offsets, lag_reported), ends)


def collect(admin: ShareGroupAdmin, groups: Sequence[str] | None,
            dead_letter_topics: Mapping[str, str] | None = None) -> Snapshot:
    """A snapshot of ``groups`` (``None``: every share group; one deleted while it is read is
    left out). ``dead_letter_topics``: ``{group: topic}`` of client-side dead-letter topics."""
    topics = dict(dead_letter_topics or {})
    names = admin.list_groups() if groups is None else list(groups)
    found = []
    for group in names:
        snap = collect_group(admin, group, topics.get(group))
        if groups is None and snap.state == NOT_FOUND:
            continue
        found.append(snap)
    return Snapshot(tuple(found))


class GroupReader:
    """One collection per call, on an admin made by ``make_admin`` when needed: after a
    failure the admin is closed and the next call connects anew (a restarted broker, a
    moved coordinator). Used by one thread at a time (the exporter's collector)."""

    def __init__(self, make_admin: Callable[[], ShareGroupAdmin], groups: Sequence[str] | None,
                 dead_letter_topics: Mapping[str, str] | None = None) -> None:
        self._make_admin = make_admin
        self._groups = None if groups is None else list(groups)
        self._dead_letter_topics = dict(dead_letter_topics or {})
        self._admin: ShareGroupAdmin | None = None

    def __call__(self) -> Snapshot:
        if self._admin is None:
            self._admin = self._make_admin()
        try:
            return collect(self._admin, self._groups, self._dead_letter_topics)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        admin, self._admin = self._admin, None
        if admin is not None:
            admin.close()
