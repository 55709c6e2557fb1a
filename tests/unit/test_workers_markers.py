"""The exactly-once workers' markers (``workers/exactly_once/markers.py``): encoding, the live set,
lookups, tombstones and what the start offsets let go. Pure: no broker."""

from __future__ import annotations

from typing import Any

from pyspark_kafka_share._kafka.partition import TopicPartition
from pyspark_kafka_share.workers.exactly_once import (
    MarkerSet,
    decode_marker,
    encode_marker,
    marker_topic,
    runs,
    transactional_id,
)
from pyspark_kafka_share.workers.outcome import Outcome

A, R = Outcome.ACCEPT, Outcome.REJECT


def test_offsets_become_sorted_runs() -> None:
    assert runs([5, 3, 4, 9, 10, 4, 1]) == [(1, 2), (3, 6), (9, 11)]
    assert runs([]) == []


def test_a_marker_holds_runs_per_partition_and_outcome_compactly() -> None:
    origins = [("t", 0, o, A) for o in range(100, 200)] + \
        [("t", 1, 7, R), ("u", 0, 3, A)]
    value = encode_marker(origins)
    assert len(value) < 120  # 102 records in a few runs
    assert decode_marker(value) == {TopicPartition("t", 0): [(100, 200, A)],
                                    TopicPartition("t", 1): [(7, 8, R)],
                                    TopicPartition("u", 0): [(3, 4, A)]}


def test_lookup_finds_the_decided_outcome_and_tombstones_remove_it() -> None:
    markers = MarkerSet()
    assert markers.apply(b"w0:1", encode_marker([("t", 0, o, A) for o in (1, 2, 3)] +
                                                [("t", 0, 4, R)])) == 0
    assert markers.apply(b"w1:1", encode_marker([("t", 0, o, A) for o in (10, 11)])) == 0
    assert [markers.lookup("t", 0, o) for o in (0, 1, 3, 4, 5, 9, 10, 11, 12)] == \
        [None, A, A, R, None, None, A, A, None]
    assert markers.lookup("t", 1, 1) is None
    assert len(markers) == 2
    markers.apply(b"w0:1", None)  # tombstone
    assert markers.lookup("t", 0, 2) is None and markers.lookup("t", 0, 10) is A
    assert len(markers) == 1


def test_a_second_marker_for_the_same_records_is_counted_as_a_conflict() -> None:
    markers = MarkerSet()
    markers.apply(b"a", encode_marker([("t", 0, o, A) for o in range(10)]))
    assert markers.apply(b"b", encode_marker([("t", 0, o, A) for o in range(8, 12)])) == 2
    # The same key again (a re-read of the log) replaces itself: no conflict with itself.
    assert markers.apply(b"b", encode_marker([("t", 0, o, A) for o in range(10, 12)])) == 0


def test_markers_below_the_start_offsets_can_go() -> None:
    markers = MarkerSet()
    markers.apply(b"done", encode_marker([("t", 0, 1, A), ("t", 1, 5, R)]))
    markers.apply(b"open", encode_marker([("t", 0, 1, A), ("t", 0, 9, A)]))
    markers.apply(b"unknown", encode_marker([("x", 0, 0, A)]))
    starts = {TopicPartition("t", 0): 9, TopicPartition("t", 1): 6}
    assert markers.passed(starts) == [b"done"]


def test_names_of_the_marker_topic_and_transactional_ids() -> None:
    assert marker_topic("scorers") == "kafka-share-markers.scorers"
    odd = marker_topic("my group/\u00e9")
    assert odd.startswith("kafka-share-markers.my_group__-") and len(odd) < 249
    assert marker_topic("x" * 240).startswith("kafka-share-markers." + "x" * 180)
    assert transactional_id("scorers", 3) == "kafka-share-workers.scorers.3"


EOS_COUNTERS = ("transactions", "transactions_aborted", "already_committed", "marker_wait_ms",
                "marker_conflicts", "released_marker_wait", "unchecked_last_deliveries",
                "producers_replaced", "marker_overlaps_aborted")


def test_the_summary_totals_count_the_exactly_once_counters_of_every_attempt() -> None:
    """Issue 29: the exactly-once counters were per worker only. A dead attempt's last report
    counts as the others do."""
    from pyspark_kafka_share.workers.api import WorkerSummary, _totals

    reports: list[dict[str, Any]] = [{"worker": 0, "attempt": 0, "state": "lost",
                **{k: i + 1 for i, k in enumerate(EOS_COUNTERS)}},
               {"worker": 0, "attempt": 1, **{k: 10 for k in EOS_COUNTERS}},
               {"worker": 1, "attempt": 0}]
    totals = _totals(reports)
    assert {k: totals[k] for k in EOS_COUNTERS} == \
        {k: i + 1 + 10 for i, k in enumerate(EOS_COUNTERS)}
    text = str(WorkerSummary(1.0, "idle timeout", totals, reports))
    assert "exactly-once: transactions=11 aborted=12 decided by a committed marker=13" in text
    # Without exactly-once outputs the line is left out.
    assert "exactly-once" not in str(WorkerSummary(1.0, "idle timeout", _totals(reports[2:])))
