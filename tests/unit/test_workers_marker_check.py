"""The exactly-once workers' commit check against the marker topic (``MarkerLog.check``, issue
37): the markers written from where the poll's barrier began up to the transaction's own
marker, read ``read_uncommitted``; another attempt's marker there over the transaction's
records aborts it. And the markers tombstoned lately, which lookups still find.
Against a scripted read_uncommitted consumer (no broker); the settler's side is in
tests/unit/test_worker_transactions.py, the window provoked for real in
tests/integration/test_workers_eos.py."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError

from pyspark_kafka_share.workers.exactly_once import MarkerLog, MarkerSet, Origin, encode_marker
from pyspark_kafka_share.workers.exactly_once.markers import Overlap, covered
from pyspark_kafka_share.workers.outcome import Outcome

A, R = Outcome.ACCEPT, Outcome.REJECT
OWN = b"0:0:abc:"
MINE: list[Origin] = [("t", 0, o, A) for o in range(10, 15)] + [("t", 1, 3, R)]


class _Rec:
    """A record of the marker topic, or the end of the partition (``eof``)."""

    def __init__(self, offset: int, key: bytes | None = None, value: bytes | None = None, *,
                 error: Any = None) -> None:
        self._offset, self._key, self._value, self._error = offset, key, value, error

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def error(self) -> Any:
        return self._error


def _eof(offset: int) -> _Rec:
    return _Rec(offset, error=KafkaError(KafkaError._PARTITION_EOF))


class _Probe:
    """A read_uncommitted consumer: the log from the offset assigned, in fetches of ``step``
    records; ``ends``: where the partition ends for its first fetches (then the log's end)."""

    def __init__(self, log: list[tuple[bytes | None, bytes | None]], step: int = 2,
                 ends: tuple[int, ...] = ()) -> None:
        self.log, self.step, self.ends = log, step, list(ends)
        self.assigned: list[int] = []
        self.at = -1
        self.unassigned = 0

    def assign(self, parts: list[Any]) -> None:
        self.assigned.append(parts[0].offset)
        self.at = max(0, parts[0].offset)

    def unassign(self) -> None:
        self.unassigned += 1
        self.at = -1

    def consume(self, n: int, timeout: float) -> list[_Rec]:
        end = self.ends.pop(0) if self.ends else len(self.log)
        if self.at >= end:
            return [_eof(end)]
        got = [_Rec(i, *self.log[i]) for i in range(self.at, min(end, self.at + self.step))]
        self.at += len(got)
        return got

    def poll(self, timeout: float) -> _Rec | None:
        return None


def _log(probe: _Probe, since: int | None = 3) -> MarkerLog:
    """A marker log whose poll's barrier began at ``since`` (None: no barrier yet)."""
    log = MarkerLog("markers", reader=None, probe=probe, partitions=[0], timeout_s=1.0,
                    own_prefix=OWN)
    if since is not None:
        log.barrier_at = {0: since}
    return log


def _marker(origins: list[Origin]) -> bytes:
    return encode_marker(origins)


def _soon() -> float:
    return time.monotonic() + 2.0


def test_covered_counts_the_origins_a_marker_holds() -> None:
    other = _marker([("t", 0, o, A) for o in range(13, 20)] + [("t", 1, 3, A), ("u", 0, 10, A)])
    assert covered(MINE, other) == 3  # t-0 13, 14 and t-1 3; u-0 10 is another partition
    assert covered(MINE, _marker([("t", 0, 15, A), ("t", 1, 4, A)])) == 0
    assert covered(MINE, None) == 0  # a tombstone covers nothing


def test_another_attempts_marker_since_the_barrier_is_an_overlap() -> None:
    entries: list[tuple[bytes | None, bytes | None]] = [
        (b"1:0:old:1", _marker(MINE)),               # 0: before the barrier: not read
        (b"x", None), (b"y", None),
        (b"1:0:def:4", _marker([("t", 0, 5, A)])),    # 3: another's, not over our records
        (b"1:0:def:5", _marker([("t", 0, 12, A)])),   # 4: another's, over one of ours
        (b"1:0:def:4", None),                        # 5: a tombstone
        (OWN + b"3", _marker([("t", 0, 11, A)])),     # 6: our own earlier (an aborted try)
        (OWN + b"4", _marker(MINE)),                  # 7: the transaction's own
        (b"1:0:def:6", _marker(MINE)),               # 8: after ours: its writer's to check
    ]
    probe = _Probe(entries)
    log = _log(probe)
    assert log.check(MINE, OWN + b"4", _soon()) == [Overlap(b"1:0:def:5", 4, 1)]
    assert probe.assigned == [3] and probe.unassigned == 1  # read from the barrier; let go
    assert log.checked_at == 7


def test_nothing_of_another_attempt_over_the_records_lets_it_commit() -> None:
    entries: list[tuple[bytes | None, bytes | None]] = [
        (b"1:0:def:4", _marker([("t", 0, 9, A), ("t", 0, 15, A)])), (OWN + b"4", _marker(MINE))]
    assert _log(_Probe(entries), since=0).check(MINE, OWN + b"4", _soon()) == []


def test_the_end_of_the_partition_before_the_own_marker_is_read_on() -> None:
    # The partition's end reached below the own marker (a new leader's high watermark behind
    # for a moment): not the answer; the read goes on until it is there.
    entries: list[tuple[bytes | None, bytes | None]] = [
        (b"1:0:def:5", _marker([("t", 0, 10, A)])), (b"z", None), (OWN + b"4", _marker(MINE))]
    probe = _Probe(entries, step=1, ends=(1, 1, 1))
    assert _log(probe, since=0).check(MINE, OWN + b"4", _soon()) == \
        [Overlap(b"1:0:def:5", 0, 1)]


def test_no_barrier_yet_reads_from_the_beginning() -> None:
    from confluent_kafka import OFFSET_BEGINNING

    probe = _Probe([(OWN + b"1", _marker(MINE))])
    assert _log(probe, since=None).check(MINE, OWN + b"1", _soon()) == []
    assert probe.assigned == [OFFSET_BEGINNING]


def test_the_own_marker_not_reached_by_the_deadline_fails_the_check() -> None:
    probe = _Probe([(b"1:0:def:5", _marker([("t", 0, 99, A)]))])  # the own one never shows
    started = time.monotonic()
    assert _log(probe, since=0).check(MINE, OWN + b"4", started + 0.2) is None
    assert time.monotonic() - started < 1.0
    assert probe.unassigned == 1


@pytest.mark.parametrize("failure", ["error", "raises"])
def test_a_read_that_fails_fails_the_check(failure: str) -> None:
    class Failing(_Probe):
        def consume(self, n: int, timeout: float) -> list[_Rec]:
            if failure == "raises":
                raise RuntimeError("the consumer is closed")
            return [_Rec(0, error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))]

    probe = Failing([(OWN + b"4", _marker(MINE))])
    assert _log(probe, since=0).check(MINE, OWN + b"4", _soon()) is None
    assert probe.unassigned == 1


def test_the_placeholder_groups_denied_lookup_does_not_fail_the_check() -> None:
    # The probe's group.id is a placeholder librdkafka insists on; with exactly the listed ACLs
    # its FindCoordinator is denied (GROUP_AUTHORIZATION_FAILED, delivered by consume). The
    # assign()-ed read never uses the group: the check reads on (it aborted every transaction
    # on a secured listener before).
    class Denied(_Probe):
        denied = False

        def consume(self, n: int, timeout: float) -> list[_Rec]:
            if not self.denied:
                self.denied = True
                return [_Rec(-1, error=KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))]
            return super().consume(n, timeout)

    probe = Denied([(b"1:0:def:5", _marker([("t", 0, 12, A)])), (OWN + b"4", _marker(MINE))])
    assert _log(probe, since=0).check(MINE, OWN + b"4", _soon()) == \
        [Overlap(b"1:0:def:5", 0, 1)]


def test_the_retired_markers_bound_is_where_the_topic_ended_before_the_previous_poll() -> None:
    # The records of a poll may have been acquired by a fetch the previous (empty) poll began:
    # a tombstone below the topic's end before that poll was written before they were
    # acquired. The first poll: where the start's read found the end (before the share
    # consumer existed).
    log = _log(_Probe([]), since=None)
    log.before = ({0: 5}, {0: 5})  # as ExactlyOnce.start leaves it after its read
    log.seen = {0: 5}
    log.polling()
    assert log.before == ({0: 5}, {0: 5})
    log.seen = {0: 9}  # the first poll's barrier
    log.polling()
    assert log.before == ({0: 5}, {0: 9})
    log.polling()  # an empty poll in between: nothing read meanwhile
    assert log.before == ({0: 9}, {0: 9})


def test_a_tombstoned_marker_is_still_found_until_its_tombstone_is_below_the_bound() -> None:
    # Case b of the argument: a record whose acquisition was dropped unseen can reach a
    # barrier that also reads its marker's tombstone; the lookup must still find the marker.
    markers = MarkerSet()
    markers.apply(b"a", _marker([("t", 0, o, A) for o in range(10)]), 4)
    markers.apply(b"b", _marker([("t", 0, 20, R)]), 5)
    markers.apply(b"a", None, 8)
    markers.apply(b"b", None, 12)
    markers.apply(b"gone", None, 13)  # never applied: nothing to keep
    assert len(markers) == 0  # not live: never tombstoned again, nor counted
    assert markers.lookup("t", 0, 3) is A and markers.lookup("t", 0, 20) is R
    markers.forget_retired(9)  # a's tombstone (8) is below the current poll's bound
    assert markers.lookup("t", 0, 3) is None and markers.lookup("t", 0, 20) is R
    markers.forget_retired(13)
    assert markers.lookup("t", 0, 20) is None
    # A tombstone without its offset (a test's set): not kept.
    markers.apply(b"c", _marker([("t", 0, 30, A)]))
    markers.apply(b"c", None)
    assert markers.lookup("t", 0, 30) is None


def test_polling_forgets_the_retired_markers_below_the_current_polls_bound() -> None:
    log = _log(_Probe([]), since=None)
    log.seen = {0: 3}
    log.polling()
    log.polling()
    log.markers.apply(b"a", _marker([("t", 0, 1, A)]), 2)
    log.markers.apply(b"a", None, 6)
    log.seen = {0: 7}
    log.polling()
    assert log.markers.lookup("t", 0, 1) is A  # the bound is 7 only from the next poll on
    log.polling()
    assert log.markers.lookup("t", 0, 1) is None
