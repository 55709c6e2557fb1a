"""Executor side of the queue workers: one long-lived share consumer per Spark task.

Per poll (explicit acknowledgement: every record of a poll is acknowledged before the next):

1. The poll's lock deadline is counted from when its records may have been acquired; it lives
   in the poll's :class:`~pyspark_kafka_share.workers.settle.Poll`.
2. Records are handed to the user's function in chunks of ``chunk_size``. Before each chunk the
   worker checks the stop flag and whether the chunk would end past the lock deadline (from the
   measured time per record); if so, the rest of the poll is RELEASEd unprocessed, except
   records on their last delivery, which RELEASE would archive. With ``client="native"`` the
   locks are renewed while the function runs (``workers/consumer.py``): only a deadline
   already too close cuts the poll short. With calls in flight (``concurrency``, or an
   ``async def`` function) the poll is worked through by
   :mod:`~pyspark_kafka_share.workers.inflight_poll` under the same rules.
3. Each record's outcome is resolved (:mod:`~pyspark_kafka_share.workers.verdict`): ACCEPT
   (optionally with an output record), RELEASE (retry; on the last allowed attempt it becomes
   poison), REJECT (poison). Poison goes to the dead-letter topic first when one is set.
4. The results are handed to the worker's settler, which owns producing, dead letters and
   acknowledgements: :class:`~pyspark_kafka_share.workers.settle.AtLeastOnceSettler` (outputs
   and dead letters produced and flushed, then ``commit_sync`` of the acknowledgements, per
   chunk), or with ``exactly_once_outputs`` the
   :class:`~pyspark_kafka_share.workers.exactly_once.settler.TransactionalSettler` (the
   markers read after each poll, the chunks of ``transaction_interval_s`` in one transaction
   with a marker of their origins, the acknowledgements after its commit).

The worker's counters travel to the driver over :mod:`_control` and as the task's result.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from pyspark_kafka_share._kafka.group import TopicWatch
from pyspark_kafka_share._kafka.share import (
    BrokerWatch,
    ConsumerSession,
    lock_budget_s,
    split_last_delivery,
)
from pyspark_kafka_share._spark import attempt_identity
from pyspark_kafka_share.workers import mistakes
from pyspark_kafka_share.workers.breaker import ChunkJudge
from pyspark_kafka_share.workers.config import WorkerSpec
from pyspark_kafka_share.workers.consumer import LockRenewer, open_consumer
from pyspark_kafka_share.workers.control import WorkerChannel, open_worker_channel
from pyspark_kafka_share.workers.exactly_once.settler import TransactionalSettler
from pyspark_kafka_share.workers.exactly_once.transactions import ExactlyOnce
from pyspark_kafka_share.workers.inflight import InFlight, is_async
from pyspark_kafka_share.workers.inflight_poll import work_concurrently
from pyspark_kafka_share.workers.outcome import Outcome, WorkerFunction
from pyspark_kafka_share.workers.phases import Phases
from pyspark_kafka_share.workers.retry import Pace, TokenBucket, worker_rate
from pyspark_kafka_share.workers.settle import (
    DLQ_HEADERS,
    AtLeastOnceSettler,
    Poll,
    Settler,
    eased,
)
from pyspark_kafka_share.workers.verdict import Final, call, resolve

__all__ = ["DLQ_HEADERS", "DUPLICATE", "ArrowTask", "run_worker", "worker_task"]

DUPLICATE = "duplicate"  # the state of an attempt that did not run: another held the lease


class _Worker:
    def __init__(self, spec: WorkerSpec, fn: WorkerFunction, *,
                 session: ConsumerSession | None = None, producer: Any = None,
                 eos: ExactlyOnce | None = None, control: WorkerChannel | None = None,
                 renewer: LockRenewer | None = None) -> None:
        """``session``/``producer``/``eos``/``control``/``renewer``: injected by tests and
        :func:`run_worker`; built from ``spec`` otherwise (``eos``: a transactional settler's
        state, which makes the worker exactly-once; ``renewer``: the native client's)."""
        config = spec.config
        self.spec = spec
        self.config = config
        self.fn = fn
        self.index, _, self.attempt = attempt_identity()
        self.stats: Counter[str] = Counter()
        self.phases = Phases(self.stats)  # the poll's wait and the function's (phases.py)
        # The worker's circuit breaker, and why the job must stop (a mistake, a trip).
        self.judge = ChunkJudge(config.circuit_breaker, config.circuit_breaker_window)
        self.failure: dict[str, Any] | None = None
        self.start = time.monotonic()
        self.last_active = self.start  # last record received or chunk finished
        self.stop_reason: str | None = None
        self.per_record_s = 0.0  # moving average of the function's time per record
        self.budget_s = lock_budget_s(spec.lock_ms, config.lock_safety_fraction)
        # The job's rate limit, this worker's share of it (issue 40, retry.py).
        self.limiter = None if config.rate_limit is None else \
            TokenBucket(worker_rate(config.rate_limit, config.workers))
        # "All brokers down" (a rolling restart) fails the worker only if it lasts.
        self.brokers = BrokerWatch(config.client, config.topics, config.broker_timeout_s)
        self.poll: Poll | None = None  # the last poll's records not yet acknowledged
        # Many calls in flight (concurrency > 1, or an async def function); None: one at a time.
        self.inflight = InFlight(fn, config, config.concurrency, self.stats,
                                 Pace(backoff=config.retry_backoff, limiter=self.limiter,
                                      attempts_allowed=spec.attempts_allowed)) \
            if config.concurrency > 1 or is_async(fn) else None
        # Exactly-once: started before the share consumer exists (no record acquired meanwhile).
        self.settler = self._settler(producer, eos)
        # The consumer of the client chosen (workers/consumer.py: the one seam).
        self.session, self.renewer = (session, renewer) if session is not None \
            else open_consumer(spec, self.index)
        # Polls of a deleted topic just come back empty: while idle, the metadata is checked
        # (not for an injected session: a test's, with no broker to ask).
        self.watch = TopicWatch(config.client, config.topics, every_s=5.0) \
            if session is None else None
        self.control = control or open_worker_channel(spec.control, spec.report_interval_s)
        # Idle from here: starting (init_transactions while the transaction coordinator loads,
        # joining) is not idleness, or a short idle_timeout_s stops workers before their poll.
        self.last_active = time.monotonic()
        self.control.start(self.report)

    def _settler(self, producer: Any, eos: ExactlyOnce | None) -> Settler:
        if eos is not None:
            return TransactionalSettler(self.spec, self.stats, eos, index=self.index,
                                        attempt=self.attempt)
        if self.config.exactly_once_outputs:
            return TransactionalSettler.start(self.spec, self.stats, index=self.index,
                                              attempt=self.attempt)
        return AtLeastOnceSettler(self.spec, self.stats, producer)

    # ---- reporting and stopping -------------------------------------------------------------

    def report(self, state: str = "running") -> dict[str, Any]:
        now = time.monotonic()
        return {
            "worker": self.index, "attempt": self.attempt, "host": socket.gethostname(),
            "pid": os.getpid(), "state": state, "elapsed_s": round(now - self.start, 3),
            # An outage is not idleness: the driver judges idle_timeout_s from this.
            "idle_s": 0.0 if self.brokers.down else round(now - self.last_active, 3),
            "stop_reason": self.stop_reason or self.settler.stop_reason,
            "failures": dict(self.judge.failures), "failure": self.failure,
            **{k: int(v) for k, v in self.stats.copy().items()},
        }

    def should_stop(self) -> bool:
        if self.stop_reason is None:
            self.stop_reason = self.settler.stop_reason  # its producer was fenced
        if self.stop_reason is not None:
            return True
        spec = self.config
        now = time.monotonic()
        if self.control.stop:
            self.stop_reason = "lost the driver" if self.control.lost else "stopped by driver"
        elif spec.time_budget_s is not None and now - self.start >= spec.time_budget_s:
            self.stop_reason = "time budget"
        elif spec.max_records is not None and self.stats["processed"] >= spec.max_records:
            self.stop_reason = "record count"
        elif (spec.idle_timeout_s is not None and now - self.last_active >= spec.idle_timeout_s
              and not self.control.ever_connected and not self.brokers.down):
            # With a driver, idleness is judged over all workers (one idle worker may be waiting
            # for an assignment while others are busy); without one, locally.
            self.stop_reason = "idle timeout"
        return self.stop_reason is not None

    # ---- the loop ------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        budget_s = self.budget_s
        try:
            while not self.should_stop():
                if self.settler.idle():
                    self._poll_once(budget_s)
                else:  # waiting to poll (exactly-once: an open transaction) is not idleness
                    self.last_active = time.monotonic()
        except mistakes.JobMistake as exc:  # the job's mistake, not the records'
            if self.inflight is not None:
                self.inflight.abandon()  # among the poll's unacknowledged records
            self._stop_on_mistake(mistakes.failure_report("mistake", str(exc), exc.option))
        except BaseException:
            if self.inflight is not None:
                self.inflight.abandon()  # among the poll's unacknowledged records
            if self.poll is not None and self.poll.unacked:
                # Records on their last delivery are archived by the broker either way (RELEASE
                # now, or the lock expiring); the others come back at once.
                with contextlib.suppress(Exception):
                    self.poll.release(self.poll.unacked)
            raise
        finally:
            self.control.close()
            self._close()
        final = self.report("stopped")
        self.control.report(final)
        self.control.close()
        return final

    def _poll_once(self, budget_s: float) -> None:
        """One poll and its records worked through (``budget_s``: of each poll's locks)."""
        polled = time.monotonic()
        msgs, acquired = self.session.poll(0.5)
        self.poll = Poll(self.session, self.stats, acquired + budget_s, list(msgs))
        was_down = self.brokers.down
        self.brokers.observe(self.session.take_errors(), bool(msgs))
        if was_down and not self.brokers.down:
            self.last_active = time.monotonic()  # idle again from the outage's end
        self.stats["polls"] += 1
        if not msgs:
            if self.inflight is not None:
                self.inflight.done(until=0)  # late results of calls given up: counted
            if not self.brokers.down and self.watch is not None:
                self.watch.check(time.monotonic() - self.last_active)
            return
        self.stats["received"] += len(msgs)
        self.phases.add("poll_wait", time.monotonic() - polled)
        self.last_active = time.monotonic()
        self._work_through(self.settler.admit(list(msgs), self.poll), self.poll)

    def _work_through(self, msgs: list[Any], poll: Poll) -> None:
        """Process ``msgs`` chunk by chunk; RELEASE what is left at a stop or the deadline.

        With exactly-once outputs the chunks processed within ``transaction_interval_s`` share
        one transaction, settled before a stop or the deadline releases the rest
        (``flush``), and at the end of the poll at the latest."""
        if self.inflight is not None:
            work_concurrently(self, msgs, poll, self.inflight)
            return
        size = self.config.chunk_size
        rest = list(msgs)
        while rest:
            poll.unacked = [*self.settler.pending(), *rest]
            chunk, rest = rest[:size], rest[size:]
            reason = self.cut_short(chunk, poll)
            if reason is not None:
                chunk, rest = self.release_but_last(chunk + rest, reason, poll), []
                poll.unacked = list(chunk)
                if not chunk:
                    break
            self._process(chunk, poll, poll_ends=not rest)
        poll.unacked = []

    def cut_short(self, chunk: list[Any], poll: Poll) -> str | None:
        """Why the poll stops before ``chunk``: a stop, or a chunk (and the settling of what
        is held) that would end past the lock deadline; None to go on. What a transaction
        holds is settled first if that is what would end past it."""
        reason = self._why_stop(chunk, poll)
        if reason is not None and self.settler.pending():
            self.settler.flush(poll)  # the chunks already processed first
            self.last_active = time.monotonic()
            reason = self._why_stop(chunk, poll)
        return reason

    def _why_stop(self, chunk: list[Any], poll: Poll) -> str | None:
        if self.should_stop():
            return "released_on_stop"
        # Renewed locks (native client) last as long as the function runs.
        work_s = 0.0 if self.renewer is not None else self.per_record_s * len(chunk)
        if poll.ends_past(work_s + self.settler.settle_s):
            self._settling_refused(poll, work_s)
            return "released_lock_deadline"
        return None

    def _settling_refused(self, poll: Poll, work_s: float) -> None:
        """A chunk was cut for the settling's average (``settle_s``) alone: bring it down
        (halved, and to half the time the poll had left after the work at most). It is
        refreshed only by settling, which it then refuses: one slow settling (a commit
        during the transaction coordinator's failover) released every later chunk
        unprocessed until its records' last delivery."""
        left = poll.deadline - time.monotonic() - work_s
        if left > 0:
            self.settler.settle_s = eased(self.settler.settle_s, 1, left)

    def release_but_last(self, msgs: list[Any], reason: str, poll: Poll) -> list[Any]:
        """RELEASE ``msgs`` (counted as ``reason``) but the records on their last delivery,
        which a RELEASE would make the broker archive (unprocessed, without a dead-letter
        record): those are returned, to be processed anyway."""
        last, give_back = split_last_delivery(msgs, self.spec.delivery_limit)
        self.stats[reason] += len(give_back)
        poll.release(give_back)
        return last

    def _process(self, chunk: list[Any], poll: Poll, *, poll_ends: bool) -> None:
        """Run the function on ``chunk`` (the records no marker decided) and hand the results
        to the settler."""
        chunk = self.settler.undecided(chunk, poll)
        t0 = time.monotonic()
        final: list[Final] = []
        if chunk:
            pace = Pace(deadline=poll.deadline - self.settler.settle_s,
                        backoff=self.config.retry_backoff, limiter=self.limiter,
                        attempts_allowed=self.spec.attempts_allowed)
            with self._renewing(poll):
                verdicts = call(self.fn, chunk, self.config, pace)
            self.stats.update(pace.counts)
            # The waits before retries are not the function's time per record.
            took_s = max(0.0, time.monotonic() - t0 - pace.counts["retry_wait_ms"] / 1000)
            final = self.screened(self.judged(
                chunk, verdicts, took_s, unprocessed=pace.counts["released_rate_limit"]))
        self.settler.settle(final, poll, poll_ends=poll_ends, began=t0)
        self.last_active = time.monotonic()

    def _renewing(self, poll: Poll) -> contextlib.AbstractContextManager[None]:
        """The poll's locks renewed while the function runs (native client), else nothing.
        Not with calls in flight (``concurrency``): the worker settles while they run, and
        the native session is not shared with the renewer's thread then."""
        return self.renewer.covering(poll) if self.renewer is not None \
            else contextlib.nullcontext()

    def judged(self, chunk: list[Any], verdicts: list[Any], took_s: float, *,
               unprocessed: int = 0) -> list[Final]:
        """The records of one call (``took_s`` long) with their outcomes resolved; counted
        (less the ``unprocessed`` the rate limit RELEASEd before the function ran)."""
        if unprocessed < len(chunk) and took_s > 0:  # a call (a Done without one: no time)
            per = took_s / len(chunk)
            first = self.stats["processed"] == 0
            self.per_record_s = per if first else 0.7 * self.per_record_s + 0.3 * per
            self.phases.add("function", took_s)
        self.stats["processed"] += len(chunk) - unprocessed
        self.stats["undecodable"] += sum(1 for v in verdicts if v.undecodable)
        return [(m, resolve(m, v, self.spec.attempts_allowed, self.stats), v)
                for m, v in zip(chunk, verdicts, strict=True)]

    # ---- a failure of the job stops the worker (workers/mistakes.py, breaker.py) ----------

    def screened(self, final: list[Final]) -> list[Final]:
        """The worker's circuit breaker judges the chunk before it is settled. Tripped: the
        failed records are RELEASEd, not REJECTed (but on their last delivery, where a
        RELEASE would archive them too), the worker stops and tells the driver at once."""
        trip = self.judge.judge([(o is Outcome.REJECT, v.error_type) for _, o, v in final])
        if trip is None:
            return final
        if self.failure is None:
            self.failure = mistakes.failure_report("breaker", trip.message(
                f"worker {self.index}"))
            self.stop_reason = "circuit breaker"
            self.control.report(self.report())
        out = [(m, o if o is Outcome.ACCEPT or m.delivery_count() >= self.spec.delivery_limit
                else Outcome.RELEASE, v) for m, o, v in final]
        self.stats["released_by_breaker"] += sum(
            1 for (_, a, _), (_, b, _) in zip(final, out, strict=True) if a is not b)
        return out

    def _stop_on_mistake(self, failure: dict[str, Any]) -> None:
        """A configuration mistake: every record held is RELEASEd (none REJECTed or
        dead-lettered, nothing held for a transaction produced), the worker stops and tells
        the driver at once."""
        self.failure = failure
        self.stop_reason = f"configuration mistake ({failure['option']})"
        dropped = self.settler.drop()  # already among the poll's unacknowledged records
        if self.poll is not None:
            seen = {id(m) for m in self.poll.unacked}
            held = [*self.poll.unacked, *(m for m in dropped if id(m) not in seen)]
            self.stats["released_on_mistake"] += len(held)
            self.poll.release(held)
            self.poll.unacked = []
        self.control.report(self.report())

    def _close(self) -> None:
        # close() RELEASEs records a background fetch acquired after the last poll.
        self.session.close()
        self.settler.close()
        if self.inflight is not None:
            self.inflight.close()


def run_worker(spec: WorkerSpec, fn: WorkerFunction) -> dict[str, Any]:
    """Run one worker until a stop condition; return its final counters.

    The worker first takes its index's lease from the driver: a speculative or late copy of
    the task waits for it, and ends without opening a consumer if the holder finishes.
    """
    index, _, attempt = attempt_identity()
    control = open_worker_channel(spec.control, spec.report_interval_s)
    if not control.acquire_lease(index, attempt):
        control.close()
        return {"worker": index, "attempt": attempt, "host": socket.gethostname(),
                "pid": os.getpid(), "state": DUPLICATE,
                "stop_reason": "another attempt of this worker holds its lease"}
    return _Worker(spec, fn, control=control).run()


ArrowTask = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
"""A ``mapInArrow`` function."""


def worker_task(spec: WorkerSpec, fn: WorkerFunction) -> ArrowTask:
    """The ``mapInArrow`` function that runs one worker per Spark partition."""

    def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import json

        for _ in batches:  # the single input row of this partition
            pass
        summary = run_worker(spec, fn)
        yield pa.RecordBatch.from_pydict({"summary": [json.dumps(summary)]})

    return task


def results_of(rows: Sequence[Any]) -> list[dict[str, Any]]:
    import json

    return [json.loads(r["summary"]) for r in rows]
