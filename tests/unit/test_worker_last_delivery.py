"""Issue 37: a record on its last delivery whose exactly-once transaction is not committed.

A RELEASE on the last delivery makes the broker archive the record (no output, no dead
letter). The transactional settler therefore puts such records in a new transaction while the
worker still holds their locks (an abort, a commit of unknown outcome, the deadline too close
with the native client's RENEW, a refused marker), and RELEASEs them, counted and logged as
``last_delivery_archived``, only when that is not safe (a connection lost, a RENEW refused, the
deadline too close without a RENEW, the tries spent); records another attempt's marker covers
are that attempt's. Records below the limit keep their RELEASE. One test per row of the table
in docs/design.md ("A transaction not committed on a last delivery"), against the fakes of
test_worker_settlers.py; the broker-side run is in tests/integration/test_workers_eos.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, cast

import pytest
from confluent_kafka import KafkaError

from pyspark_kafka_share._kafka.native.adapter import NativeMessage, NativeSession
from pyspark_kafka_share._kafka.native.consumer import NativeShareConsumer, ShareRecord
from pyspark_kafka_share.errors import ErrorCode
from pyspark_kafka_share.workers.exactly_once import Origin
from pyspark_kafka_share.workers.exactly_once.markers import Overlap
from pyspark_kafka_share.workers.exactly_once.settler import TransactionalSettler
from pyspark_kafka_share.workers.outcome import Outcome
from pyspark_kafka_share.workers.settle import Poll
from pyspark_kafka_share.workers.verdict import Final, Verdict

from .fakes import FakeMarkerLog, FakeNative
from .test_worker_settlers import (
    _final,
    _kafka_error,
    _marked,
    _poll,
    _settle,
    _transactional,
    _TxnProducer,
)

LAST = 5  # the spec's delivery_limit: deliveries from here on are the last


def _outputs(producer: _TxnProducer) -> list[bytes | None]:
    return [v for txn in producer.committed for t, _k, v in txn if t in ("out", "dlq")]


def _counts(settler: TransactionalSettler) -> tuple[int, int]:
    return settler.stats["last_delivery_retries"], settler.stats["last_delivery_archived"]


def test_an_aborted_commit_on_the_last_delivery_is_tried_again() -> None:
    """The commit failed and was aborted (the locks are held, time is left): the record on its
    last delivery goes in a new transaction and is ACCEPTed after its commit; the one below
    the limit is RELEASEd as before (a later delivery retries it)."""
    producer = _TxnProducer(commits=[_kafka_error("_STATE", abortable=True)])
    settler, consumer, _ = _transactional(producer)
    final = [_final(1, dc=LAST)[0], (_final(2)[1])]
    _settle(settler, final, _poll(consumer, settler.stats))
    assert producer.events == ["begin", "commit", "abort", "begin", "commit"]
    assert _marked(producer) == [[0]] and _outputs(producer) == [b"o0"]
    assert consumer.acks == {0: "ACCEPT", 1: "RELEASE"}
    assert _counts(settler) == (1, 0)
    assert settler.stats["transactions"] == 1 and settler.stats["transactions_aborted"] == 1


def test_a_dead_letter_on_its_last_delivery_is_tried_again_too() -> None:
    producer = _TxnProducer(commits=[_kafka_error("_STATE", abortable=True)])
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(2, dc=LAST, reject=frozenset({1})), _poll(consumer, settler.stats))
    assert sorted(t for txn in producer.committed for t, _k, _v in txn) == \
        ["dlq", "markers", "out"]
    assert consumer.acks == {0: "ACCEPT", 1: "REJECT"} and _counts(settler) == (1, 0)


def test_a_commit_of_unknown_outcome_that_did_not_go_through_is_tried_again() -> None:
    """The commit timed out (the producer is replaced: its init_transactions aborts the open
    one); the markers, read to the end, do not cover the records: a new transaction."""
    producer = _TxnProducer(commits=[_kafka_error("_TIMED_OUT")])
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(2, dc=LAST), _poll(consumer, settler.stats))
    assert _marked(producer) == [[0, 1]] and _outputs(producer) == [b"o0", b"o1"]
    assert consumer.acks == {0: "ACCEPT", 1: "ACCEPT"}
    assert settler.stats["producers_replaced"] == 1 and _counts(settler) == (1, 0)


class _CommitsThenTimesOut(_TxnProducer):
    """The first commit goes through, then its reply is lost (a timeout); the marker log
    (``log``) reads what was committed."""

    def __init__(self, log: FakeMarkerLog) -> None:
        super().__init__()
        self.log, self.lost = log, False

    def commit_transaction(self, timeout: float) -> None:
        super().commit_transaction(timeout)
        if not self.lost:
            self.lost = True
            for topic, key, value in self.committed[-1]:
                if topic == "markers" and key is not None:
                    self.log.markers.apply(key, value)  # read by the next catch_up
            raise RuntimeError(_kafka_error("_TIMED_OUT"))


def test_a_commit_of_unknown_outcome_that_went_through_is_not_produced_again() -> None:
    """The commit went through and its reply was lost: the marker read after the producer's
    replacement finds it, and the records are ACCEPTed from it, not produced twice."""
    log = FakeMarkerLog()
    producer = _CommitsThenTimesOut(log)
    settler, consumer, eos = _transactional(producer)
    eos.log = cast(Any, log)
    _settle(settler, _final(2, dc=LAST), _poll(consumer, settler.stats))
    assert len(producer.committed) == 1 and _outputs(producer) == [b"o0", b"o1"]
    assert consumer.acks == {0: "ACCEPT", 1: "ACCEPT"}
    assert settler.stats["already_committed"] == 2 and _counts(settler) == (0, 0)


def test_the_deadline_too_close_without_a_renew_archives_loudly(
        caplog: pytest.LogCaptureFixture) -> None:
    """librdkafka cannot renew: with the deadline too close nothing is safe; the record is
    RELEASEd, and the loss is counted and logged with its offset."""
    producer = _TxnProducer()
    settler, consumer, _ = _transactional(producer)
    with caplog.at_level(logging.WARNING):
        _settle(settler, _final(2, dc=LAST), _poll(consumer, settler.stats, deadline_s=0.1))
    assert producer.events == ["begin", "abort"]
    assert consumer.acks == {0: "RELEASE", 1: "RELEASE"} and _counts(settler) == (0, 2)
    assert "2 record(s) on their last delivery RELEASEd" in caplog.text
    assert "in-0@0, in-0@1" in caplog.text and "deadline is too close" in caplog.text


def _native_poll(settler: TransactionalSettler, native: FakeNative,
                 deadline_s: float) -> tuple[Poll, list[Final]]:
    """A native poll of two records on their last delivery, its deadline ``deadline_s``
    away."""
    poll = Poll(NativeSession(cast(NativeShareConsumer, native)), settler.stats,
                time.monotonic() + deadline_s)
    final: list[Final] = [(NativeMessage(ShareRecord("in", 0, i, 1, None, b"v", (), LAST,
                                                     time.monotonic() + 30)),
                           Outcome.ACCEPT, Verdict(Outcome.ACCEPT, b"o%d" % i))
                          for i in range(2)]
    return poll, final


def test_the_deadline_too_close_with_a_renew_is_tried_again() -> None:
    """The native client RENEWs the records first: confirmed, the deadline moves and the new
    transaction commits."""
    producer = _TxnProducer()
    settler, _, _ = _transactional(producer)
    native = FakeNative([])
    poll, final = _native_poll(settler, native, 0.1)
    rest = NativeMessage(ShareRecord("in", 0, 9, 1, None, b"v", (), 1, time.monotonic() + 30))
    poll.unacked = [*(m for m, _, _ in final), rest]  # the poll's next chunk, not processed yet
    _settle(settler, final, poll)
    assert producer.events == ["begin", "abort", "begin", "commit"]
    assert native.acks == {0: "ACCEPT", 1: "ACCEPT"} and _counts(settler) == (1, 0)
    # The deadline moved for the whole poll: every record it holds was renewed with them.
    assert poll.deadline > time.monotonic() + 10 and poll.unacked == [rest]
    assert settler.stats["renewed"] == 3 + 2  # the poll before the retry, its check


def test_a_renew_the_leader_refuses_archives_loudly() -> None:
    """The commit check's RENEW was refused (the locks may be lost): not tried again."""
    producer = _TxnProducer()
    settler, _, _ = _transactional(producer)
    native = FakeNative([], renew_code=ErrorCode.INVALID_RECORD_STATE)
    poll, final = _native_poll(settler, native, 30)
    _settle(settler, final, poll)
    assert producer.events == ["begin", "abort"]
    assert native.acks == {0: "RELEASE", 1: "RELEASE"} and _counts(settler) == (0, 2)


def test_a_connection_lost_since_the_poll_archives_loudly() -> None:
    producer = _TxnProducer()
    settler, consumer, eos = _transactional(producer)
    eos.txn.errors.append(KafkaError(KafkaError._TRANSPORT))
    _settle(settler, _final(2, dc=LAST), _poll(consumer, settler.stats))
    assert producer.events == ["begin", "abort"]
    assert consumer.acks == {0: "RELEASE", 1: "RELEASE"} and _counts(settler) == (0, 2)


def test_another_attempts_marker_leaves_the_records_to_it() -> None:
    """Another attempt's marker covers the records: they are its own now (it commits them);
    the RELEASE is right and is no loss of this worker's."""

    def overlap(origins: Sequence[Origin]) -> list[Overlap]:
        return [Overlap(b"1:0:y:7", 42, len(origins))]

    producer = _TxnProducer()
    settler, consumer, eos = _transactional(producer)
    eos.log = cast(Any, FakeMarkerLog(overlap))
    _settle(settler, _final(2, dc=LAST), _poll(consumer, settler.stats))
    assert producer.events == ["begin", "abort"]
    assert consumer.acks == {0: "RELEASE", 1: "RELEASE"} and _counts(settler) == (0, 0)
    assert settler.stats["marker_overlaps_aborted"] == 1


class _RefusesFirstMarker(_TxnProducer):
    """Refuses the marker of the first transaction only."""

    def __init__(self) -> None:
        super().__init__(lambda t, v: t == "markers" and v is not None)
        self.flushes = 0

    def flush(self, timeout: float) -> int:
        self.flushes += 1
        if self.flushes > 1:
            self.refuse = lambda t, v: False
        return super().flush(timeout)


def test_a_refused_marker_on_the_last_delivery_is_tried_again() -> None:
    """The marker alone was refused (no record's own fault): a new transaction."""
    producer = _RefusesFirstMarker()
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(2, dc=LAST), _poll(consumer, settler.stats))
    assert producer.events == ["begin", "abort", "begin", "commit"]
    assert consumer.acks == {0: "ACCEPT", 1: "ACCEPT"} and _counts(settler) == (1, 0)


def test_the_retries_are_bounded() -> None:
    """Every commit aborted: three transactions in all, then the records are RELEASEd and the
    loss counted; the worker goes on (no exception)."""
    producer = _TxnProducer(commits=[_kafka_error("_STATE", abortable=True)] * 5)
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(2, dc=LAST), _poll(consumer, settler.stats))
    assert producer.events.count("commit") == 3 and producer.committed == []
    assert consumer.acks == {0: "RELEASE", 1: "RELEASE"} and _counts(settler) == (2, 2)
    assert settler.stop_reason is None


def test_a_fenced_producer_archives_loudly() -> None:
    producer = _TxnProducer(commits=[_kafka_error("PRODUCER_FENCED", fatal=True)])
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(2, dc=LAST), _poll(consumer, settler.stats))
    assert consumer.acks == {0: "RELEASE", 1: "RELEASE"} and _counts(settler) == (0, 2)
    assert settler.stop_reason is not None


def test_records_below_the_limit_keep_their_release() -> None:
    producer = _TxnProducer(commits=[_kafka_error("_STATE", abortable=True)])
    settler, consumer, _ = _transactional(producer)
    _settle(settler, _final(2, dc=LAST - 1), _poll(consumer, settler.stats))
    assert producer.events == ["begin", "commit", "abort"]
    assert consumer.acks == {0: "RELEASE", 1: "RELEASE"} and _counts(settler) == (0, 0)


def test_the_summary_shows_the_archived_records() -> None:
    from pyspark_kafka_share.workers.api import WorkerSummary, _totals

    reports: list[dict[str, Any]] = [{"worker": 0, "attempt": 0, "transactions": 3,
                                      "last_delivery_retries": 2, "last_delivery_archived": 1}]
    text = str(WorkerSummary(1.0, "idle timeout", _totals(reports), reports))
    assert "last deliveries retried=2 last deliveries archived=1" in text
    assert "WARNING: 1 record(s) on their last delivery were RELEASEd" in text
    reports[0]["last_delivery_archived"] = 0
    assert "WARNING" not in str(WorkerSummary(1.0, "idle timeout", _totals(reports), reports))
