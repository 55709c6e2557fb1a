"""The transactional settler: the worker's results with exactly-once outputs.

The chunks a worker processed within ``transaction_interval_s`` (never of two polls) are held
open, then their outputs, dead letters and one marker of their origins produced in one Kafka
transaction, committed only while the poll's locks are provably held (before the deadline, with
the commit's own time as margin, no connection loss since the poll, and with the native client
the broker confirming a RENEW of the transaction's records once its marker is in the log); their
acknowledgements follow the commit. Before a poll's records are processed, the committed markers
are read (:meth:`TransactionalSettler.admit`) and the records a marker covers are acknowledged
as it decided (:meth:`TransactionalSettler.undecided`).

A transaction ends :class:`Committed`, :class:`Refused` (produces the broker refused, by the
record's index in its group, and those of the marker or tombstones, which have no index) or
:class:`NotCommitted`. A refusal starts the bisection (:meth:`TransactionalSettler._bisect`).
The fault points of the commit path (``kill-before-commit`` and the others) are here.

The commit check (:meth:`TransactionalSettler._check_commit`): no connection lost since the
poll, no other attempt's marker over the transaction's records written since the poll's
barrier began (:meth:`~.markers.MarkerLog.check`; ``marker_overlaps_aborted``), the deadline
not too close; else abort and RELEASE.

Not committed while the worker still holds the locks (an abort, a commit of unknown outcome,
the deadline too close, a refused marker): the records on their last delivery, which a
RELEASE would make the broker archive, are not RELEASEd but put in a new transaction
(:meth:`TransactionalSettler._last_deliveries`; at most ``_LAST_DELIVERY_RETRIES``, before
the deadline, with the native client after a RENEW; after an unknown outcome only those its
marker did not decide). What cannot be is RELEASEd, counted (``last_delivery_archived``) and
logged. The table: docs/design.md, "A transaction not committed on a last delivery".
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pyspark_kafka_share._kafka.faults import Faults
from pyspark_kafka_share._kafka.produce import Refusal
from pyspark_kafka_share._kafka.share import lock_budget_s, split_last_delivery
from pyspark_kafka_share.errors import BrokerError, Fenced, TransactionFailed
from pyspark_kafka_share.workers.config import WorkerSpec
from pyspark_kafka_share.workers.consumer import Renewing
from pyspark_kafka_share.workers.exactly_once.markers import Origin, Overlap, origins_of
from pyspark_kafka_share.workers.exactly_once.transactions import ExactlyOnce
from pyspark_kafka_share.workers.outcome import Outcome
from pyspark_kafka_share.workers.phases import Phases
from pyspark_kafka_share.workers.settle import (
    Item,
    Out,
    Poll,
    ProduceFailures,
    dead_letter_items,
    eased,
    output_failed,
    output_items,
    produce_all,
)
from pyspark_kafka_share.workers.verdict import Final

__all__ = ["Committed", "NotCommitted", "Refused", "TransactionalSettler"]

_log = logging.getLogger(__name__)
Locks = Literal["held", "elsewhere", "unknown"]  # TransactionFailed.locks

_COMMIT_MARGIN_S = 0.2  # at least this much of the lock budget left for a commit
_LAST_DELIVERY_RETRIES = 2  # new transactions for last deliveries after one not committed
_OPEN_TXN_SWEEP_S = 10.0  # transaction.abort.timed.out.transaction.cleanup.interval.ms default


@dataclass(frozen=True)
class Committed:
    """The transaction was committed (``key``: its marker's; None: tombstones alone)."""

    key: bytes | None


@dataclass(frozen=True)
class Refused:
    """The broker refused produces (the transaction was aborted): ``records``, by the index of
    the record in its group, and ``own``, the marker's or a tombstone's."""

    records: dict[int, Refusal]
    own: tuple[Refusal, ...] = ()


@dataclass(frozen=True)
class NotCommitted:
    """Neither committed nor refused (aborted, outcome unknown, or fenced): ``why``; whether
    the worker still holds the records (``locks``, as :class:`TransactionFailed` says), and
    whether the outcome is ``unknown`` (a commit that timed out: the markers decide)."""

    why: str
    locks: Locks = "held"
    unknown: bool = False


TransactionResult = Committed | Refused | NotCommitted
_Todo = list[tuple[list[Final], bool]]  # groups to settle, and whether each was retried


class TransactionalSettler:
    """Outputs, dead letters and a marker per transaction; see the module docstring."""

    def __init__(self, spec: WorkerSpec, stats: Counter[str], eos: ExactlyOnce, *,
                 index: int, attempt: int) -> None:
        self.spec, self.config, self.stats, self.eos = spec, spec.config, stats, eos
        self.index, self.attempt = index, attempt
        self.settle_s = 0.0
        self.stop_reason: str | None = None
        self.failures = ProduceFailures(spec.config)
        # The chunks processed since the open transaction's first one (its Kafka transaction
        # begins when it is committed, flush), and when that one began.
        self.open: list[Final] = []
        self.open_since = 0.0
        self.held_since = 0.0  # when the open transaction's first chunk joined it
        self.missed_at: float | None = None  # when a poll's barrier last missed its deadline
        self.hold_from: float | None = None  # since when no poll waits for the marker topic
        self.phases = Phases(stats)  # per-phase timings (workers/phases.py)
        self.phases.add("marker_hold", 0.0)  # reported from the start: 0 until a barrier misses

    @classmethod
    def start(cls, spec: WorkerSpec, stats: Counter[str], *, index: int,
              attempt: int) -> TransactionalSettler:
        """The transactional producer (init_transactions fences older attempts of the slot)
        and the markers read so far: before the share consumer exists, so that no record is
        acquired while they start."""
        config = spec.config
        eos = ExactlyOnce.start(config.client, config.producer_settings(), index, attempt,
                                lock_budget_s(spec.lock_ms, config.lock_safety_fraction))
        return cls(spec, stats, eos, index=index, attempt=attempt)

    # ---- the worker's hooks ----------------------------------------------------------------

    def admit(self, msgs: list[Any], poll: Poll) -> list[Any]:
        """The barrier after a poll: the committed markers up to the marker topic's end, open
        transactions there decided. Not done by the poll's deadline: the poll is RELEASEd,
        except records on their last delivery (processed unchecked, counted)."""
        self.eos.new_poll()
        with self.phases.timed("marker_wait"):
            done = self.eos.log.catch_up(poll.deadline, barrier=True)
        self.phases.add("marker_open_txn", self.eos.log.stalled_s)
        self.stats["marker_conflicts"] = self.eos.log.conflicts
        if done:
            self.missed_at = None
            return msgs
        self.missed_at = self.missed_at or time.monotonic()
        last, give_back = split_last_delivery(msgs, self.spec.delivery_limit)
        self.stats["released_marker_wait"] += len(give_back)
        self.stats["unchecked_last_deliveries"] += len(last)
        poll.release(give_back)
        return last

    def undecided(self, chunk: list[Any], poll: Poll) -> list[Any]:
        """Acknowledge the records a committed marker covers as it decided; the others."""
        decided = [(m, o) for m in chunk if (o := self.eos.decided(m)) is not None]
        if not decided:
            return chunk
        self.stats["already_committed"] += len(decided)
        poll.ack(decided)
        done = {id(m) for m, _ in decided}
        return [m for m in chunk if id(m) not in done]

    def pending(self) -> list[Any]:
        return [m for m, _, _ in self.open]

    def settle(self, final: list[Final], poll: Poll, *, poll_ends: bool, began: float) -> None:
        """Hold ``final`` in the open transaction; commit it at the poll's end or once it has
        been open for ``transaction_interval_s``."""
        if final and not self.open:
            self.open_since, self.held_since = began, time.monotonic()
        self.open.extend(final)
        if not self.open:
            return
        if poll_ends or time.monotonic() - self.open_since >= \
                self.config.transaction_interval_s:
            self.flush(poll)
        else:
            self._open_fault()

    def flush(self, poll: Poll) -> None:
        """Settle the open transaction's chunks: their outputs, dead letters and one marker in
        one Kafka transaction, then their acknowledgements."""
        if not self.open:
            return
        final, self.open = self.open, []
        first = self.stats["transactions"] + self.stats["transactions_aborted"] == 0
        t0 = time.monotonic()
        self.phases.add("txn_held", t0 - self.held_since)
        refused = self._bisect(final, poll)
        self.failures.count(refused, final)
        took = time.monotonic() - t0
        self.settle_s = took if first else 0.7 * self.settle_s + 0.3 * took

    def drop(self) -> list[Any]:
        held, self.open = [m for m, _, _ in self.open], []
        return held

    def idle(self) -> bool:
        if not self._barrier_clear():
            return False
        self.eos.log.polling()  # first: before this idle's own marker read
        with self.phases.timed("marker_gc"):  # every GC_EVERY_S: the markers passed
            due = self.eos.due(time.monotonic())
        if due:
            self._tombstones_alone()
        return True

    def _barrier_clear(self) -> bool:
        """After a poll's barrier missed its deadline (a transaction left open on the marker
        topic), no poll until the topic is read to its end: a poll would acquire records, each
        acquisition a delivery, only to RELEASE them at the next miss (docs/design.md). Read a
        second at a time (the loop checks for a stop between), for at most the transaction
        timeout and the broker's sweep (:data:`_OPEN_TXN_SWEEP_S`) since the miss."""
        if self.missed_at is None:
            return True
        now = time.monotonic()
        self.hold_from = self.hold_from or now
        done = self.eos.log.catch_up(now + 1.0)
        if done or time.monotonic() - self.missed_at > \
                max(1.0, self.eos.lock_budget_s) + _OPEN_TXN_SWEEP_S:
            self.phases.add("marker_hold", time.monotonic() - self.hold_from)
            self.missed_at = self.hold_from = None
            return True
        time.sleep(max(0.0, now + 1.0 - time.monotonic()))  # a read failed at once: no spin
        return False

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.eos.tombstones:
                self._tombstones_alone()
        self.eos.close()

    # ---- the refused-produce bisection -----------------------------------------------------

    def _bisect(self, final: list[Final], poll: Poll) -> bool:
        """Outputs, dead letters and the marker of ``final`` (the chunks of the open
        transaction) in one transaction, then the acknowledgements; True if a produce failed.

        A refused produce aborts the transaction, and with it what was produced beside the
        refused record (the broker refuses a whole batch; the abort fails the rest): the
        records whose produce did not fail are settled in a new transaction, and those whose
        produce failed in halves, each half in one of its own (bisection: a few transactions
        find the refused record). A refusal of a record alone is its own: its verdict
        changes as without transactions (output: a retry; dead letter: a RELEASE, or another
        try on the last delivery) and it is tried once more. So one refused output costs no
        other record an attempt.
        Not committed: everything left is RELEASEd (a commit that went through after all is
        found by the marker check when the records come back), but the records on their last
        delivery, tried again in a new transaction while that is safe
        (:meth:`_last_deliveries`)."""
        todo: _Todo = [(final, False)]
        refused = False
        tries = 0
        while todo:
            group, retried = todo.pop(0)
            result = self._transact_group(group, poll)
            if isinstance(result, Committed):
                continue
            if isinstance(result, Refused):
                refused = True
                self._after_refusal(result)
                if result.records:
                    self._split(group, retried, result.records, todo, poll)
                    continue
                # Only the marker or a tombstone: no record's own fault (and aborted).
                result = NotCommitted(f"a produce to the marker topic failed: {result.own}")
            again = self._last_deliveries([group, *(g for g, _ in todo)], result, poll, tries)
            todo = [(again, False)] if again else []
            tries += 1
        return refused

    def _last_deliveries(self, groups: list[list[Final]], result: NotCommitted, poll: Poll,
                         tries: int) -> list[Final]:
        """After a transaction was not committed (``tries`` after the first): RELEASE the
        records of ``groups`` (a later delivery retries them), but those on their last
        delivery, which a RELEASE would make the broker archive: returned for a new
        transaction (the same outputs and dead letters, a new marker) while the worker holds
        their locks, a few times at most and before the deadline (with the native client
        renewed first). After an unknown outcome the markers are read first: those its marker
        decided are acknowledged as it did. The others are RELEASEd, counted as
        ``last_delivery_archived`` and logged (unless another attempt's marker covers them:
        theirs to settle)."""
        limit = self.spec.delivery_limit
        items = [x for g in groups for x in g]
        last = [x for x in items if x[0].delivery_count() >= limit]
        poll.release([m for m, _, _ in items if m.delivery_count() < limit])
        if last and result.unknown and result.locks == "held" and self.stop_reason is None:
            last = self._undecided_last(last, poll)
        if not last:
            return []
        why = self._why_not_again(result, last, poll, tries)
        if why is None:
            self.stats["last_delivery_retries"] += 1
            return last
        poll.release([m for m, _, _ in last])
        if result.locks != "elsewhere":
            self._archived(last, why)
        return []

    def _archived(self, last: Sequence[Final], why: str) -> None:
        """``last`` was RELEASEd on its last delivery: counted and logged, never silent."""
        self.stats["last_delivery_archived"] += len(last)
        _log.warning(
            "kafka-share worker %d: %d record(s) on their last delivery RELEASEd after their "
            "transaction was not committed (%s); the broker archives them, without an output "
            "or a dead letter: %s", self.index, len(last), why,
            ", ".join(f"{m.topic()}-{m.partition()}@{m.offset()}" for m, _, _ in last[:20])
            + (" ..." if len(last) > 20 else ""))

    def _undecided_last(self, last: list[Final], poll: Poll) -> list[Final]:
        """After a commit of unknown outcome (the producer replaced: its ``init_transactions``
        completed or aborted the transaction): the committed markers read to the topic's end;
        the records a marker decided are acknowledged as it did, the others returned. Not
        read by the deadline: none returned, all RELEASEd (a new transaction could output
        them twice)."""
        with self.phases.timed("marker_wait"):
            done = self.eos.log.catch_up(poll.deadline)
        if not done:
            poll.release([m for m, _, _ in last])
            self._archived(last, "a commit of unknown outcome, and the markers could not be "
                           "read by the deadline to tell")
            return []
        undecided = {id(m) for m in self.undecided([m for m, _, _ in last], poll)}
        return [x for x in last if id(x[0]) in undecided]

    def _why_not_again(self, result: NotCommitted, last: list[Final], poll: Poll,
                       tries: int) -> str | None:
        """Why ``last`` (records on their last delivery) cannot go in a new transaction after
        ``result``, or None: the locks held, a try left, the native client's RENEW confirmed
        (the deadline moves), time left for a commit."""
        if self.stop_reason is not None:
            return f"{result.why}; the worker stops"
        if result.locks != "held":
            return result.why
        if tries >= _LAST_DELIVERY_RETRIES:
            return f"{result.why}; {tries + 1} transactions tried"
        if isinstance(poll.session, Renewing):  # every record the poll holds: its deadline
            start = time.monotonic()
            ids = {id(m) for m, _, _ in last}
            lost = _not_held(poll, [*(m for m, _, _ in last),
                                    *(m for m in poll.unacked if id(m) not in ids)])
            if lost is not None:
                return f"{result.why}; then {lost}"
            poll.deadline = max(poll.deadline, start + self.eos.lock_budget_s)
        if poll.ends_past(_commit_margin_s(self.eos)):
            return f"{result.why}; no time left for another before the lock deadline"
        return None

    def _split(self, group: list[Final], retried: bool, failed: dict[int, Refusal], todo: _Todo,
               poll: Poll) -> None:
        """The next transactions after ``group``'s ``failed`` records were refused."""
        if len(group) > 1:  # the ones delivered, then the failed ones in halves
            ok = [x for i, x in enumerate(group) if i not in failed]
            bad = [group[i] for i in sorted(failed)]
            halves = [bad] if len(bad) == 1 else [bad[:len(bad) // 2], bad[len(bad) // 2:]]
            todo[:0] = [(g, False) for g in (ok, *halves) if g]
        elif not retried:
            self._refused_verdict(group, failed)
            todo.insert(0, (group, True))
        else:
            self._refused_twice(group, poll)

    def _transact_group(self, group: list[Final], poll: Poll) -> TransactionResult:
        """One transaction of ``group``, acknowledged once committed."""
        outputs = output_items(group, self.config)
        dead = dead_letter_items(group, self.config)
        try:
            result = self._transact([*outputs, *dead],
                                     origins_of([(m, o) for m, o, _ in group]), poll,
                                     [m for m, _, _ in group])
        except TransactionFailed as exc:
            self._aborted(exc)
            return NotCommitted(str(exc), exc.locks, unknown=exc.fatal)
        except Fenced as exc:
            self.stop_reason = str(exc)
            return NotCommitted(str(exc))
        if isinstance(result, Refused):
            return result
        self.stats["outputs"] += len(outputs)
        self.stats["dead_lettered"] += len(dead)
        with self.phases.timed("txn_ack"):
            settled = poll.ack([(m, o) for m, o, _ in group])
        if result.key is not None:
            self.eos.confirmed(result.key, settled.confirmed)
        return result

    def _after_refusal(self, refused: Refused) -> None:
        self.stats["produce_failures"] += len(refused.records) + len(refused.own)
        self.stats["transactions_aborted"] += 1
        # After a refused produce librdkafka purges the next transaction's first record to
        # that partition (_PURGE_QUEUE): a new producer (init_transactions) starts clean.
        # Not while the brokers are unreachable (the connection-loss path handles that).
        if self.eos.session_lost() is None:
            self.stats["producers_replaced"] += 1
            self.eos.replace_producer()

    def _refused_verdict(self, group: list[Final], failed: dict[int, Refusal]) -> None:
        """The record of ``group`` (one) was refused alone: its own verdict changes."""
        for i, err in failed.items():
            m, outcome, v = group[i]
            if outcome is Outcome.ACCEPT:
                output_failed(group, i, err, self.spec, self.stats)
            elif m.delivery_count() < self.spec.delivery_limit:
                group[i] = (m, Outcome.RELEASE, v)

    def _refused_twice(self, group: list[Final], poll: Poll) -> None:
        """Refused again after its verdict changed: RELEASE it, unless it is a dead letter on
        its last delivery (a RELEASE would archive it): the worker fails."""
        m, outcome, _ = group[0]
        if outcome is Outcome.REJECT and m.delivery_count() >= self.spec.delivery_limit \
                and self.config.dead_letter_topic is not None:
            raise BrokerError(
                f"the dead-letter topic {self.config.dead_letter_topic!r} did not take record "
                f"{m.topic()}-{m.partition()}@{m.offset()} on its last delivery in two "
                "transactions; the broker archives the record")
        poll.release([m])

    # ---- one transaction -------------------------------------------------------------------

    def _tombstones_alone(self) -> None:
        """A transaction of the tombstones due (while idle, and at the end)."""
        try:
            self._transact([], [], None)
        except TransactionFailed as exc:
            self._aborted(exc)
        except Fenced as exc:
            self.stop_reason = str(exc)

    def _aborted(self, exc: TransactionFailed) -> None:
        self.stats["transactions_aborted"] += 1
        if exc.fatal:
            self.stats["producers_replaced"] += 1
            self.eos.replace_producer()

    def _transact(self, items: Sequence[Item], origins: list[Origin],
                  poll: Poll | None, held: Sequence[Any] = ()) -> Committed | Refused:
        """One transaction: ``items``, the marker of ``origins`` (of the records ``held``)
        and the tombstones due.
        Raises :class:`TransactionFailed` if it was not committed for another reason than a
        refused produce: past the ``poll``'s deadline (with the commit's own time as margin), a
        connection lost since the poll, a failed commit; :class:`Fenced` if a newer attempt of
        the slot took over."""
        eos = self.eos
        key: bytes | None = None
        own: list[Out] = []
        if origins:
            key, value = eos.next_marker(origins)
            own.append(Out(eos.txn.topic, key, value))
        own.extend(Out(eos.txn.topic, k, None) for k in eos.take_tombstones())
        if not (items or own):
            return Committed(None)
        faults = Faults(self.config._fault_injection, seq=eos.seq, part=self.index,
                        attempt_number=self.attempt)
        if origins:  # test only: the marker written late (after another worker's poll)
            faults.hit("sleep-before-produce")
        with self.phases.timed("txn_produce"):
            eos.txn.begin()
            errs = produce_all(eos.txn.producer, [*(it.out for it in items), *own],
                               self.config.broker_timeout_s)
        refused = Refused({it.index: err for it, err in zip(items, errs[:len(items)], strict=True)
                           if err is not None},
                          tuple(err for err in errs[len(items):] if err is not None))
        if refused.records or refused.own:
            eos.txn.abort("a produce failed")
            return refused
        faults.hit("kill-before-commit")
        faults.hit("sleep-before-commit")
        if poll is not None:
            with self.phases.timed("txn_check"):
                self._check_commit(poll, key, origins, held, faults)
        during = faults.points.get("kill-during-commit")
        if during is not None:  # the worker dies while commit_transaction runs
            threading.Timer(int(during.get("ms", "5")) / 1000, os._exit, (137,)).start()
        with self.phases.timed("txn_commit"):
            eos.txn.commit(faults.commit())
        self.stats["transactions"] += 1
        eos.committed(key, origins)
        faults.hit("kill-after-commit")
        faults.hit("sleep-after-commit")  # the cluster tier kills the executor meanwhile
        return Committed(key)

    def _check_commit(self, poll: Poll, key: bytes | None, origins: list[Origin],
                      held: Sequence[Any], faults: Faults) -> None:
        """Abort (TransactionFailed) unless the poll's records can be committed: no connection
        lost since the poll, no other attempt's marker over them written since the poll's
        barrier began (docs/design.md, "Why no record's outputs are committed twice"), the
        deadline not too close (the marker read gets until the deadline), and with a consumer
        that RENEWs (the native client) the broker still holding ``held`` for it now that the
        marker is in the log (:func:`_not_held`). ``faults``: test only, ``ignore-deadline``
        waives the deadline (an acquisition lost with nobody told, which the deadline cannot
        see; the read then gets ``broker_timeout_s``)."""
        eos = self.eos
        waived = "ignore-deadline" in faults.points
        until = time.monotonic() + self.config.broker_timeout_s if waived else poll.deadline
        found: list[Overlap] = []

        def unread() -> str | None:  # the markers from the barrier up to the own one
            nonlocal found
            read = [] if key is None else eos.log.check(origins, key, until)
            if read is None:
                return "the markers since the poll's barrier could not be read up to its own"
            found = read
            return None

        checks: list[tuple[Locks, Callable[[], str | None]]] = [
            ("unknown", eos.session_lost), ("unknown", unread),
            ("elsewhere", lambda: self._overlap(key, origins, found)),
            ("held", lambda: None if waived else _too_close(poll, eos)),
            ("unknown", lambda: _not_held(poll, held))]
        for locks, check in checks:
            why = check()
            if why is not None:
                eos.txn.abort(why)
                raise TransactionFailed(f"not committed: {why}", locks=locks)

    def _overlap(self, key: bytes | None, origins: list[Origin],
                 found: list[Overlap]) -> str | None:
        """Why the transaction of marker ``key`` must not commit for the other attempts'
        markers ``found`` from the poll's barrier up to ``key`` (None: it may)."""
        if key is None or not found:
            return None
        self.stats["marker_overlaps_aborted"] += 1
        log = self.eos.log
        _log.warning("kafka-share worker %d: transaction of marker %r (offset %d of the marker "
                     "topic, read from %s) aborted: %s", self.index, key, log.checked_at,
                     log.barrier_at,
                     ", ".join(f"marker {o.key!r} at offset {o.offset} covers {o.origins} of "
                               f"its {len(origins)} record(s)" for o in found))
        return f"another attempt's marker covers its records ({found[0].key!r})"

    def _open_fault(self) -> None:
        """Test only: ``kill-in-open-transaction:chunks=N`` (``seq``: the open transaction's
        number) kills the worker once N chunks wait in its open transaction."""
        if self.config._fault_injection is None:
            return
        point = Faults(self.config._fault_injection, seq=self.eos.seq + 1, part=self.index,
                       attempt_number=self.attempt).points.get("kill-in-open-transaction")
        size = self.config.chunk_size
        if point is not None and len(self.open) >= int(point.get("chunks", "2")) * size:
            os._exit(137)


def _commit_margin_s(eos: ExactlyOnce) -> float:
    """The lock time a commit needs left: twice the moving average of the commits' time, at
    least ``_COMMIT_MARGIN_S`` (the commit check's and a last delivery's retry's alike)."""
    return max(_COMMIT_MARGIN_S, 2 * eos.txn.commit_s)


def _too_close(poll: Poll, eos: ExactlyOnce) -> str | None:
    """Why the poll's lock deadline leaves no time to commit, or None: less than the margin
    (twice the moving average of the commits' time, at least ``_COMMIT_MARGIN_S``) left.

    The average is refreshed only by commits, which it then refuses: one slow commit (the
    transaction coordinator's failover, 10-20 s under load) made it refuse every later
    transaction of the worker, each abort costing its records a delivery until the broker
    archived them (the coordinator-kill test: lag 0, 60-76 origins missing). So a refusal
    for the average alone brings it down (halved, and to a margin of half the time this poll
    had left at most): a poll like this one commits and measures the time again."""
    txn = eos.txn
    if not poll.ends_past(_commit_margin_s(eos)):
        return None
    left = poll.deadline - time.monotonic()
    if left > _COMMIT_MARGIN_S:
        txn.commit_s = eased(txn.commit_s, 2, left)
    return "the poll's lock deadline is too close"


def _not_held(poll: Poll, held: Sequence[Any]) -> str | None:
    """Why the broker may no longer hold ``held`` for this consumer, or None.

    A consumer that RENEWs (the native client) asks the partition leaders: a RENEW every one
    confirmed means each acquisition was still this consumer's after the marker was flushed,
    so a later acquirer's barrier waits for the transaction's decision (case (b) of
    docs/design.md, "Queue workers: exactly-once outputs", now also for a leader that failed
    or moved, or a session that expired, unseen by the producer and the marker reader).
    A lost connection, a new leader or an expired session fail the RENEW. librdkafka's
    consumer cannot tell (None): the remaining window stays open for it."""
    session = poll.session
    if not held or not isinstance(session, Renewing):
        return None
    try:
        settled = session.renew(held)
    except Exception as exc:  # noqa: BLE001 - any failure: not provably held
        poll.stats["renew_failures"] += len(held)
        return f"renewing the transaction's records failed: {exc}"
    lost = [m for m in held if not settled.confirms(m)]
    poll.stats["renewed"] += len(held) - len(lost)
    if not lost:
        return None
    poll.stats["renew_failures"] += len(lost)
    return (f"the broker did not confirm holding {len(lost)} of the transaction's records ("
            + ", ".join(f"{tp.topic}-{tp.partition}: {why}"
                        for tp, why in sorted(settled.failed.items())) + ")")

