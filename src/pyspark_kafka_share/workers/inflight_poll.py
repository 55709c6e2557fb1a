"""One poll's records worked through with many calls in flight (``concurrency``, issue 40).

The worker loop (``loop``) hands a poll here when its function runs with calls in flight
(``concurrency`` > 1, or an ``async def`` function): up to ``concurrency`` units (records, or
chunks of a batch function) run at once on :class:`~pyspark_kafka_share.workers.inflight.InFlight`;
their completions are judged and handed to the worker's settler as they come, and new units
start in their places. The poll's lock deadline rules as without concurrency: at a stop or the
deadline the units not started are RELEASEd (but records on their last delivery, which a
RELEASE would archive); at the deadline the units still running are given up and RELEASEd too
(those of last deliveries waited for until their lock ends).

What this needs of the worker is :class:`Worker` (the loop's worker is one); ``InFlight`` is
the mechanism (threads, an event loop), this module the poll's rules around it.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any, Protocol

from pyspark_kafka_share.workers.config import WorkerConfig, WorkerSpec
from pyspark_kafka_share.workers.inflight import InFlight
from pyspark_kafka_share.workers.settle import Poll, Settler
from pyspark_kafka_share.workers.verdict import Final, Verdict

__all__ = ["Worker", "work_concurrently"]


class Worker(Protocol):
    """What a poll with calls in flight uses of its worker (``loop``'s)."""

    @property
    def spec(self) -> WorkerSpec: ...
    @property
    def config(self) -> WorkerConfig: ...
    @property
    def settler(self) -> Settler: ...
    @property
    def stats(self) -> Counter[str]: ...
    @property
    def budget_s(self) -> float:
        """The lock's safety share (seconds): a poll's deadline is its start plus this."""
    last_active: float
    """Monotonic: the last record received or chunk settled (idleness is judged from it)."""

    def cut_short(self, chunk: list[Any], poll: Poll) -> str | None:
        """Why the poll stops before ``chunk`` (after settling what is held); None: go on."""

    def release_but_last(self, msgs: list[Any], reason: str, poll: Poll) -> list[Any]:
        """RELEASE ``msgs`` (counted as ``reason``) but the last deliveries; those."""

    def judged(self, chunk: list[Any], verdicts: list[Verdict], took_s: float, *,
               unprocessed: int = 0) -> list[Final]:
        """The records of one call with their outcomes resolved; counted (less the
        ``unprocessed`` the rate limit RELEASEd before the function ran)."""

    def screened(self, final: list[Final]) -> list[Final]:
        """``final`` as the worker's circuit breaker lets it be settled."""


def work_concurrently(worker: Worker, msgs: list[Any], poll: Poll, inflight: InFlight) -> None:
    """Keep up to ``concurrency`` units of ``msgs`` in flight until every one is settled or
    RELEASEd; see the module docstring."""
    size = 1 if worker.config.batch_format == "record" else worker.config.chunk_size
    _Pass(worker, poll, inflight, deque(msgs[i:i + size] for i in range(0, len(msgs), size)))\
        .run()


class _Pass:
    """One poll's pass: ``units`` not started yet; ``cut``: a stop or the deadline cut the
    poll short (the units left are last deliveries, started anyway)."""

    def __init__(self, worker: Worker, poll: Poll, inflight: InFlight,
                 units: deque[list[Any]]) -> None:
        self.worker, self.poll, self.inflight, self.units = worker, poll, inflight, units
        self.settler = worker.settler
        self.cut = False

    def run(self) -> None:
        """Settle the completions as they come and start new units in their places."""
        inflight = self.inflight
        inflight.begin(deadline=lambda: self.poll.deadline - self.settler.settle_s)
        try:
            while self.units or inflight.pending:
                self._refill()
                if inflight.pending:
                    self._take_completions()
        finally:
            inflight.end()
        if self.settler.pending():  # every unit was given up: what completed before is held
            self.settler.flush(self.poll)
        self.poll.unacked = []

    def _refill(self) -> None:
        """Start units while a slot is free, unless a stop or the deadline cuts the poll short
        (then only the last deliveries are left to start, as without concurrency)."""
        self._mark_unacked()  # a unit started stays among them
        inflight, poll = self.inflight, self.poll
        inflight.start_due()  # the retries whose wait is over first
        while self.units and inflight.busy < inflight.slots:
            reason = None if self.cut else self.worker.cut_short(self.units[0], poll)
            if reason is not None:
                self.cut = True
                size = len(self.units[0])
                last = self.worker.release_but_last(
                    [m for unit in self.units for m in unit], reason, poll)
                self.units = deque(last[i:i + size] for i in range(0, len(last), size))
                continue
            unit = self.settler.undecided(self.units.popleft(), poll)
            if unit:
                inflight.start(unit)

    def _take_completions(self) -> None:
        """Wait for completions (until the deadline, less the settling's time; with an open
        transaction, until its interval ends) and settle them; past the deadline, give up
        the units still running."""
        worker, poll, settler = self.worker, self.poll, self.settler
        give_up_at = poll.deadline - settler.settle_s
        now = time.monotonic()
        wake = give_up_at if now < give_up_at else self._lock_end()
        if settler.pending():
            wake = min(wake, now + max(worker.config.transaction_interval_s, 0.01))
        retry_at = self.inflight.next_wake()
        if retry_at is not None and self.inflight.busy < self.inflight.slots:
            wake = min(wake, retry_at)  # a retry's wait ends: started at the next refill
        done = self.inflight.done(until=wake)
        if done:
            final = [x for d in done for x in worker.judged(
                d.unit, d.verdicts, d.took_s, unprocessed=sum(v.unprocessed for v in d.verdicts))]
            self._mark_unacked(also=[m for d in done for m in d.unit])
            settler.settle(worker.screened(final), poll,
                           poll_ends=not (self.units or self.inflight.busy),
                           began=min(d.began for d in done))
            worker.last_active = time.monotonic()
        elif settler.pending():  # the open transaction's interval may have ended
            settler.settle([], poll, poll_ends=False, began=now)
        if time.monotonic() >= give_up_at:
            self._give_up()

    def _give_up(self) -> None:
        """RELEASE the units running past the deadline (an async task is cancelled, a
        thread's late result discarded); records on their last delivery, which a RELEASE
        would archive, are waited for until their lock ends (as without concurrency)."""
        lock_end = self._lock_end()
        limit = self.worker.spec.delivery_limit

        def keep(unit: list[Any]) -> bool:
            return time.monotonic() < lock_end and \
                all(m.delivery_count() >= limit for m in unit)

        given_up = self.inflight.abandon(keep)
        if given_up:
            self.worker.stats["released_in_flight"] += len(given_up)
            self.poll.release(given_up)

    def _lock_end(self) -> float:
        """When the poll's locks end (its deadline is the lock's safety share of that)."""
        return self.poll.deadline - self.worker.budget_s + self.worker.spec.lock_ms / 1000

    def _mark_unacked(self, also: Sequence[Any] = ()) -> None:
        """The poll's unacknowledged records (what a mistake or a crash RELEASEs): held for a
        transaction, ``also`` (completed, being settled), running, not started."""
        self.poll.unacked = [*self.settler.pending(), *also, *self.inflight.records(),
                             *(m for unit in self.units for m in unit)]
