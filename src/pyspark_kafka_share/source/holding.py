"""Journal slots of several fetches (``client=native``): when an exactly-once task polls again
before it journals what it holds, and when it publishes.

librdkafka wants every record of a poll acknowledged before the next poll, and a record is
ACCEPTed only once its slot exists and the fence was re-read, so with librdkafka a slot is one
poll. The native consumer may poll while it holds records, so the task keeps polling without
acknowledging while that is safe and worth it, then journals everything it holds in ONE slot,
re-reads the fence and ACCEPTs all of it (``task.py``). It publishes (:func:`keep_holding`
says no) when

- a poll came back empty, or with fewer than half the records of the largest poll held: with
  the share fetch's minimum of one byte a fetch returns what is waiting at once, so a short
  poll says the waiting records are taken and what follows is the stream's trickle; and held
  records count in the group's lag, which keeps other tasks' drain probes waiting;
- the records held reach the group's in-flight limit per share partition
  (``share.partition.max.record.locks``, read at planning on Kafka 4.3+, else
  :data:`DEFAULT_RECORD_LOCKS`) divided by the tasks sharing a partition (``numPartitions``
  over the topics' partitions): the broker hands out no more of a partition beyond the limit,
  and one task holding all of it left the others without records (8 tasks on 1 partition:
  a task ended on ``pollTimeoutMs`` with part of its share); each poll asks for at most that
  share too (a task may hold its whole budget instead where the sharers' budgets come to at
  most twice the limit: :meth:`HoldLimits.of`); or they come so near that share that the
  next poll could bring no more than half the largest poll held, which would end the hold
  anyway: that fetch is a round trip for a few records (measured: a task holding 1,879 of
  2,000 got 61 more, then published), so the task publishes without it, unless that poll
  reads the rest of the task's budget and the rest fits (it is needed anyway);
- the first held poll's lock deadline is near (:attr:`HoldLimits.margin_s`, or twice the
  slowest poll-and-hold round so far): that deadline governs the whole slot;
- the task's record budget is spent (the poller then returns no more polls, as for its time
  budget, and the task publishes what it holds).

A held record's acquisition may also end before its lock does: a lost share session, a moved
leader or a fenced member releases it on the broker, which may hand it to another task (or
back to this one). The consumer counts such events (``acquisitions_lost``); a hold that saw
one, or that holds a record twice, is *tainted*: it is given back as a poll past its deadline
is (duplicates ACCEPTed, last deliveries journaled, the rest RELEASEd), never journaled whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pyspark_kafka_share._kafka.arrow import ColumnarPoll, join_polls

__all__ = ["DEFAULT_RECORD_LOCKS", "HOLD_MARGIN_SHARE", "Hold", "HoldLimits", "has_repeats",
           "keep_holding", "poll_keys", "record_key"]

DEFAULT_RECORD_LOCKS = 2_000
"""The broker's default of ``share.partition.max.record.locks`` (``group.share.partition.
max.record.locks``): the cap of a slot where the group config cannot be read (Kafka 4.2)."""

HOLD_MARGIN_SHARE = 0.5
"""A task publishes what it holds once less than this share of the lock budget
(``lockSafetyFraction`` x lock duration) is left before the first held poll's deadline: the
rest covers the lookup, the slot's creates, the fence read and the ACCEPT, as a single poll's
journaling has the whole budget today."""


@dataclass(frozen=True)
class HoldLimits:
    """How much a slot of several fetches may hold: ``cap`` records (0: one poll per slot,
    librdkafka), until ``margin_s`` before the first held poll's lock deadline."""

    cap: int
    margin_s: float

    @classmethod
    def of(cls, native: bool, record_locks: int | None, lock_budget_s: float,
           sharers: int = 1, budget: int | None = None) -> HoldLimits:
        """The native client's limits from the group's in-flight limit, divided among the
        ``sharers`` tasks that share a topic partition, and the lock budget; librdkafka's (no
        holding) otherwise. A task may hold its whole record ``budget`` where the sharers'
        budgets come to at most twice the limit: one slot for its share (a 1,250-record
        share split at the divided limit of 2,000 / 2 took two slots, 4 requests each on an
        object store), as librdkafka's one poll takes it; half the sharers at most then wait
        one round trip, for the first half's ACCEPT. More sharers keep the divided limit:
        lifted for 8 tasks on one partition, the first two took all 2,000 locks and the
        others polled empty, wave after wave (an independent review of b84a192)."""
        if not native:
            return cls(0, lock_budget_s)
        limit = record_locks or DEFAULT_RECORD_LOCKS
        sharers = max(1, sharers)
        cap = limit // sharers
        if budget is not None and budget > 0 and sharers * budget <= 2 * limit:
            cap = max(cap, min(budget, limit))
        return cls(max(1, cap), HOLD_MARGIN_SHARE * lock_budget_s)


def keep_holding(limits: HoldLimits, *, held: int, largest_poll: int, last_poll: int,
                 first_deadline: float, now: float, slowest_round_s: float,
                 budget_left: int | None = None) -> bool:
    """Whether the task polls again before it journals the ``held`` records (the last poll
    brought ``last_poll``, the largest held ``largest_poll``); see the module docstring.
    The task's budget is the poller's (no poll comes once it is spent); ``budget_left``: what
    is left of it. A short next poll is not worth a round trip of its own, unless the task
    needs it anyway to read the rest of its budget and the rest fits in this slot: then
    holding saves the slot it would otherwise take."""
    if last_poll <= 0 or 2 * last_poll < largest_poll:
        return False
    rest_fits = budget_left is not None and 0 < budget_left <= limits.cap - held
    if 2 * (limits.cap - held) < largest_poll and not rest_fits:
        return False  # at the limit, or the next poll is short
    return first_deadline - now > max(limits.margin_s, 2 * slowest_round_s)


def record_key(m: Any) -> tuple[str, int, int]:
    """A record's (topic, partition, offset)."""
    return (m.topic(), m.partition(), m.offset())


def poll_keys(poll: Sequence[Any]) -> set[tuple[str, int, int]]:
    """The :func:`record_key` of each record of ``poll`` (a columnar poll's from its offsets,
    without message objects)."""
    if isinstance(poll, ColumnarPoll):
        return {(tp.topic, tp.partition, o) for tp, offsets in poll.offsets_by_partition().items()
                for o in offsets.tolist()}
    return {record_key(m) for m in poll}


def has_repeats(poll: Sequence[Any]) -> bool:
    """Whether ``poll`` holds a record twice (a columnar poll: from its offsets per
    partition, which joining the held polls computes anyway)."""
    if isinstance(poll, ColumnarPoll):
        return any(len(np.unique(offsets)) != len(offsets)
                   for offsets in poll.offsets_by_partition().values())
    return len(poll_keys(poll)) != len(poll)


@dataclass
class Hold:
    """The polls a task holds unacknowledged for its next slot, in poll order; ``lost``: the
    consumer's ``acquisitions_lost`` when the first was taken."""

    polls: list[Sequence[Any]] = field(default_factory=list)
    first_deadline: float = 0.0
    records: int = 0
    largest: int = 0
    lost: int = 0

    def add(self, msgs: Sequence[Any], deadline: float, lost: int) -> None:
        if not self.polls:
            self.first_deadline, self.lost = deadline, lost
        self.polls.append(msgs)
        self.records += len(msgs)
        self.largest = max(self.largest, len(msgs))

    def tainted(self, lost: int, joined: Sequence[Any]) -> bool:
        """Whether an acquisition may have ended while held: the consumer counted a loss
        since the first poll (``lost`` is its count now), or a record is held twice (in
        ``joined``, what :meth:`joined` gave)."""
        return lost != self.lost or (len(self.polls) > 1 and has_repeats(joined))

    def joined(self) -> Sequence[Any]:
        """Everything held as one poll (``_kafka.arrow.join_polls``); empty if nothing."""
        return join_polls(self.polls) if self.polls else []

    def clear(self) -> None:
        self.polls, self.records, self.largest = [], 0, 0
