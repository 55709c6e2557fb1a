"""The offset Spark logs for each micro-batch of the ``kafka-share`` source.

Offsets carry no Kafka positions (a share group keeps those on the broker). Spark writes the
offset to its log before running the batch, so a re-run batch gets the same plan, and each
task finds its records in the journal under ``(seq, part)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark_kafka_share._kafka.partition import TopicPartition

__all__ = ["EXACTLY_ONCE_POLLS_PER_SHARE", "POLLS_PER_SHARE", "BatchOffset", "backlog_share",
           "poll_size"]

MIN_POLL = 128  # below this a poll costs more than it spreads (one producer batch or less)
MAX_POLL = 2048  # the consumer's own max.poll.records (2,000) decides above this
POLLS_PER_SHARE = 4  # at-most-once: a poll is about a quarter of a task's share
EXACTLY_ONCE_POLLS_PER_SHARE = 1
"""Exactly-once: a poll of up to a task's whole share (the power of two at or below it), so a
task reads its share in one or two polls. Each poll that brings fresh records costs a journal
slot (four requests on an object store, an fsync on a filesystem), where a poll of
at-most-once costs a broker round trip only (docs/design.md, "Records per poll"). The price:
a task whose first poll comes back short can overshoot its share by up to one poll less one
record, taking records a later task would have read (which then ends on the drain probe)."""


@dataclass(frozen=True)
class BatchOffset:
    """Batch ``seq`` runs ``parts`` tasks reading at most ``max_records`` records in all
    (0: unlimited). ``backlog`` is the group's lag when the batch was planned (None: unknown;
    0 in the JSON, as offsets always logged it), which the tasks share out, and ``ends`` the
    high watermark of each partition then (empty: unknown; ``"topic:partition"`` keys in the
    JSON): a task that polls a record at or past its partition's end reads
    records produced after the plan, and stops. ``poll`` caps the records of one poll
    (``max.poll.records``; 0: the consumer's own), so that the first tasks to poll leave the
    others their share (see :func:`poll_size`). ``share``: the records of ``backlog`` one
    task reads at most (:func:`backlog_share`; 0: the even share, as offsets logged before it
    read). Logged by Spark as ``{"seq": n, "parts": p, "max": m, "backlog": b, "ends": {...},
    "poll": q, "share": s}``."""

    seq: int
    parts: int
    max_records: int = 0
    backlog: int | None = None
    ends: Mapping[TopicPartition, int] = field(default_factory=dict)
    poll: int = 0
    share: int = 0

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> BatchOffset:
        """The offset Spark hands back (its JSON, parsed)."""
        return cls(int(raw["seq"]), int(raw["parts"]), int(raw.get("max", 0)),
                   int(raw.get("backlog") or 0) or None,
                   {TopicPartition.parse(str(k)): int(v)
                    for k, v in dict(raw.get("ends") or {}).items()},
                   int(raw.get("poll", 0)), int(raw.get("share", 0)))

    def json(self) -> dict[str, Any]:
        """What Spark logs."""
        return {"seq": self.seq, "parts": self.parts, "max": self.max_records,
                "backlog": self.backlog or 0,
                "ends": {tp.key(): end for tp, end in self.ends.items()}, "poll": self.poll,
                "share": self.share}

    def following(self, parts: int, max_records: int, backlog: int | None,
                  ends: Mapping[TopicPartition, int] | None = None, *,
                  lags: Sequence[int] = (),
                  polls_per_share: int = POLLS_PER_SHARE) -> BatchOffset:
        """The plan of the next batch (``lags``: ``backlog`` per subscribed partition, empty:
        unknown); its poll size follows this one's (:func:`poll_size`), from the even share
        (the spread among tasks is per poll)."""
        plan = BatchOffset(self.seq + 1, parts, max_records, backlog or None, dict(ends or {}))
        even = plan.task_share()[1]
        previous = self.poll if self.seq else None  # seq 0: the initial offset
        share = backlog_share(backlog, parts, lags) if backlog else 0
        return dataclasses.replace(plan, poll=poll_size(even, previous, polls_per_share),
                                   share=0 if share == even else share)

    def task_share(self) -> tuple[int | None, int | None]:
        """(records per task under ``max_records``, records per task of ``backlog``: ``share``
        or the even share); None: unbounded. Rounded up: a batch reads at least what was there
        when it was planned."""
        return (-(-self.max_records // self.parts) if self.max_records else None,
                (self.share or -(-self.backlog // self.parts)) if self.backlog else None)

    def exact_share(self, part: int) -> int | None:
        """Task ``part``'s share of ``max_records`` (None: unbounded): the shares sum to it,
        the first ``max_records % parts`` tasks taking one more."""
        if not self.max_records:
            return None
        return self.max_records // self.parts + (part < self.max_records % self.parts)


def poll_size(share: int | None, previous: int | None,
              polls_per_share: int = POLLS_PER_SHARE) -> int:
    """Records per poll (0: the consumer's own ``max.poll.records``) for tasks whose share of
    the backlog is ``share`` (None: unknown), after a batch that polled ``previous`` (None:
    the query's first batch).

    A task acknowledges and journals per poll, and the broker hands out whole producer
    batches up to the poll's size: a task asking for more than its share at once takes
    other tasks' records, and tasks that poll later get nothing (with a per-record cost
    downstream, those tasks then sit idle). A quarter of the share per poll
    (``polls_per_share``: :data:`POLLS_PER_SHARE`) lets every task reach its share in about
    four polls, so a task overshoots it by less than a quarter (or one producer batch) and a
    late one still finds its own. Exactly-once asks for fewer, larger polls
    (:data:`EXACTLY_ONCE_POLLS_PER_SHARE`): each poll is a journal slot. Powers of two between
    ``MIN_POLL`` and ``MAX_POLL``. After the query's first batch the size only grows, by 4x
    or more: pooled consumers are per configuration, and a new size means new consumers
    joining the group (about one heartbeat interval each, and more while consumers of the
    old size hold records). Shrinking it would mean new consumers in each of the small
    batches at the end of a backlog; a task that finds its share taken ends on the drain
    probe instead.
    """
    if share is None:
        return previous or 0
    # the power of two <= share / polls_per_share
    want = 1 << (max(1, share // polls_per_share).bit_length() - 1)
    want = min(max(want, MIN_POLL), MAX_POLL)
    if previous is not None:
        before = previous or MAX_POLL
        if want < 4 * before:
            return previous
    return 0 if want == MAX_POLL else want


def backlog_share(backlog: int, parts: int, lags: Sequence[int]) -> int:
    """Records of ``backlog`` one of ``parts`` tasks reads at most: the even share, or more
    where the ``lags`` per subscribed partition (empty: unknown) are skewed, up to what one
    task's consumer may be assigned. The broker assigns a consumer partitions, not records:
    with no more consumers than partitions (P), each gets about ceil(P / parts) of them (the
    heaviest such set bounds its share); with more, about parts // P consumers share each.
    An even share gave a consumer of a drained partition nothing to read and capped the one
    holding the backlog at half of it: a skewed backlog halved batch by batch (with
    ``Trigger.AvailableNow`` on Spark 4.0/4.1, run by run). A task still stops at records
    produced after the plan (``ends``) and at its share of ``maxRecordsPerTrigger``."""
    even = -(-backlog // parts)
    waiting = sorted((n for n in lags if n > 0), reverse=True)
    if not waiting:
        return even
    if parts <= len(lags):
        heaviest = sum(waiting[:-(-len(lags) // parts)])
    else:
        heaviest = -(-waiting[0] // (parts // len(lags)))
    return min(backlog, max(even, heaviest))
