"""When an exactly-once task with the native client polls again before journaling what it
holds (``source/holding.py``), and what a slot of several fetches is made of: the polls held
as one (``_kafka.arrow.join_polls``) keep each record once, in poll order."""

from __future__ import annotations

import pytest

from pyspark_kafka_share.source.holding import (
    DEFAULT_RECORD_LOCKS,
    HOLD_MARGIN_SHARE,
    Hold,
    HoldLimits,
    keep_holding,
    poll_keys,
)
from tests.unit.fakes import Msg

NATIVE = HoldLimits.of(True, 10_000, 15.0)  # lock 30 s x lockSafetyFraction 0.5


def _keep(limits: HoldLimits = NATIVE, *, held: int = 500, largest: int = 500, last: int = 500,
          left_s: float = 14.0, slowest_s: float = 0.1) -> bool:
    return keep_holding(limits, held=held, largest_poll=largest, last_poll=last,
                        first_deadline=100.0 + left_s, now=100.0, slowest_round_s=slowest_s)


def test_the_native_client_holds_up_to_the_groups_in_flight_limit() -> None:
    assert HoldLimits(10_000, HOLD_MARGIN_SHARE * 15.0) == NATIVE
    assert HoldLimits.of(True, None, 15.0).cap == DEFAULT_RECORD_LOCKS == 2_000
    assert _keep(held=9_750, largest=500)
    assert not _keep(held=10_000, largest=500), "at the in-flight limit: publish"
    assert not _keep(held=10_001, largest=1), "past it (whole producer batches)"


def test_a_hold_near_the_limit_publishes_without_a_short_poll() -> None:
    # The next poll can bring at most cap - held records; fewer than half the largest poll
    # held would end the hold anyway, so its round trip is saved.
    assert _keep(held=9_750, largest=500, last=500)
    assert not _keep(held=9_751, largest=500, last=500)
    assert not _keep(HoldLimits.of(True, None, 15.0), held=1_879, largest=1_879, last=1_879)
    assert _keep(HoldLimits.of(True, None, 15.0), held=1_000, largest=1_000, last=1_000)


def test_tasks_sharing_a_partition_share_its_in_flight_limit() -> None:
    """8 tasks on one partition hold 250 records each at most (the source's spread bench: one
    task holding all 2,000 left the others without records until it ended on pollTimeoutMs)."""
    shared = HoldLimits.of(True, None, 15.0, sharers=8)
    assert shared.cap == 250
    assert _keep(shared, held=200, largest=100, last=100)  # room for a full poll of 100
    assert not _keep(shared, held=201, largest=100, last=100), "the next poll would be short"
    assert not _keep(shared, held=250, largest=100, last=100)
    assert HoldLimits.of(True, 3, 15.0, sharers=8).cap == 1, "at least one record"
    assert HoldLimits.of(False, 2_000, 15.0, sharers=8).cap == 0


def test_a_share_under_the_limit_is_one_slot() -> None:
    """The real run of the journal bench (8 tasks on 4 partitions, 1,250 records each a
    batch, the default limit of 2,000): the divided limit (1,000) split every task's share
    into two slots; a budget under the limit lifts the cap to it, and a short last poll that
    reads the rest of the budget joins the slot instead of taking one of its own."""
    small = HoldLimits.of(True, None, 15.0, sharers=2, budget=1_250)
    assert small.cap == 1_250
    assert HoldLimits.of(True, None, 15.0, sharers=2, budget=2_001).cap == 1_000, \
        "a share over the limit: the divided limit"
    assert HoldLimits.of(True, None, 15.0, sharers=8, budget=10_000).cap == 250, "the spread"
    assert HoldLimits.of(True, None, 15.0, sharers=2, budget=600).cap == 1_000
    # Lifted only where the sharers' budgets come to at most twice the limit: more, and the
    # first tasks would take every lock while the others poll empty, wave after wave.
    assert HoldLimits.of(True, None, 15.0, sharers=4, budget=1_000).cap == 1_000
    assert HoldLimits.of(True, None, 15.0, sharers=4, budget=1_001).cap == 500
    assert HoldLimits.of(True, None, 15.0, sharers=8, budget=500).cap == 500
    assert HoldLimits.of(True, None, 15.0, sharers=8, budget=750).cap == 250
    assert HoldLimits.of(True, None, 15.0, sharers=8, budget=2_000).cap == 250
    assert HoldLimits.of(True, None, 15.0, sharers=1, budget=3_000).cap == 2_000, "the limit"
    assert HoldLimits.of(False, None, 15.0, sharers=2, budget=1_250).cap == 0

    def keep(held: int, left: int | None) -> bool:
        return keep_holding(small, held=held, largest_poll=1_024, last_poll=1_024,
                            first_deadline=114.0, now=100.0, slowest_round_s=0.1,
                            budget_left=left)

    assert keep(1_024, 226), "the rest fits: its poll joins this slot"
    assert not keep(1_024, None), "no budget: a short next poll is not worth a round trip"
    assert not keep(1_024, 227), "the rest does not fit: publish now"
    assert not keep(1_250, 0), "nothing left"


def test_librdkafka_journals_every_poll_alone() -> None:
    assert HoldLimits.of(False, 10_000, 15.0).cap == 0
    assert not _keep(HoldLimits.of(False, 10_000, 15.0), held=1, largest=1, last=1)


@pytest.mark.parametrize(("last", "largest", "keep"), [
    (0, 500, False),  # an empty poll: the group may be drained
    (249, 500, False),  # fewer than half the largest held: the waiting records are taken
    (250, 500, True),
    (1, 1, True),  # a trickle from the start: held until the deadline or the cap
])
def test_a_short_or_empty_poll_publishes(last: int, largest: int, keep: bool) -> None:
    assert _keep(last=last, largest=largest) is keep


@pytest.mark.parametrize(("left_s", "slowest_s", "keep"), [
    (7.6, 0.1, True),
    (7.5, 0.1, False),  # half the lock budget left before the first held poll's deadline
    (9.0, 4.6, False),  # two of the slowest rounds would not fit before the margin
    (9.5, 4.6, True),
    (-1.0, 0.0, False),
])
def test_the_first_held_polls_deadline_governs(left_s: float, slowest_s: float,
                                               keep: bool) -> None:
    assert _keep(left_s=left_s, slowest_s=slowest_s) is keep


def test_a_hold_keeps_the_first_polls_deadline_and_every_record_once_in_order() -> None:
    hold = Hold()
    assert hold.joined() == []
    hold.add(["a", "b"], 10.0, 3)
    assert hold.joined() == ["a", "b"], "one poll: itself"
    hold.add(["c"], 12.0, 4)
    hold.add(["d", "e", "f"], 11.0, 4)
    assert (hold.first_deadline, hold.records, hold.largest, hold.lost) == (10.0, 6, 3, 3)
    assert list(hold.joined()) == ["a", "b", "c", "d", "e", "f"]
    hold.clear()
    assert (hold.polls, hold.records, hold.largest) == ([], 0, 0)


def test_a_hold_is_tainted_by_a_loss_since_its_first_poll_or_a_record_held_twice() -> None:
    """A lost session, moved leader or fenced member since the first held poll (the
    consumer's count moved), or one record in two held polls (it was released and acquired
    again): the hold must not be journaled whole."""
    hold = Hold()
    hold.add([Msg(0), Msg(1)], 10.0, 2)
    assert not hold.tainted(2, hold.joined())
    assert hold.tainted(3, hold.joined()), "a loss counted after the first poll"
    hold.add([Msg(2), Msg(3, partition=1)], 10.0, 2)
    assert not hold.tainted(2, hold.joined()), \
        "other offsets, or the same offset of another partition"
    hold.add([Msg(1, dc=2)], 10.0, 2)
    assert hold.tainted(2, hold.joined()), "offset 1 held twice"
    assert poll_keys([Msg(5, topic="t", partition=2)]) == {("t", 2, 5)}
