"""Many calls of the user's function in flight in one worker (``concurrency``, issue 40).

:class:`InFlight` runs up to ``concurrency`` units at once, a unit being one record
(``batch_format="record"``) or one chunk of ``chunk_size`` records (``arrow``/``pandas``): an
``async def`` function as tasks on one event loop (a thread of its own), a plain function on
``concurrency`` threads. The worker loop (``loop``) starts units, takes their completions as
they come (:meth:`InFlight.done`) and hands them to its settler, whichever guarantee it gives,
then starts new units in their places: no unit waits for a slower one.

A unit still running at its poll's deadline is given up (:meth:`InFlight.abandon`): the loop
RELEASEs its records, an async task is cancelled, a thread cannot be (its side effects still
happen) and its late result is discarded when it comes back (counted ``late_discarded``). A
thread that runs a unit given up is replaced, so the slots stay ``concurrency``; it ends once
its unit returns. The threads are daemons: a hung call never holds the Python worker's exit.

How full the slots stayed while the worker had records to work on: ``slot_ms`` (the sum over
time of the units in flight) against ``slot_capacity_ms`` (``concurrency`` times that time).

Pacing (``retry_backoff``, ``Result.retry(after=...)``, ``rate_limit``; ``retry.py``), given a
:class:`~pyspark_kafka_share.workers.retry.Pace` and the poll's deadline (:meth:`InFlight.begin`):

- A record whose call asked for a retry waits in :attr:`InFlight._waiting`, holding no slot and
  no thread (nothing sleeps): the loop starts it again once its wait is over
  (:meth:`InFlight.start_due`), before the records not started yet. Only while the retry would
  end before the deadline (its estimate: the failed call's time per record); else its RELEASE
  is settled, as one at a time. A batch unit's records asking for a retry are retried together,
  once the longest of their waits is over.
- The rate limit gates each call's start: its tokens are reserved when the unit starts, and the
  call (an async task, or the pool thread) begins once they are there, its slot held meanwhile.
  Tokens that would come after the deadline: the unit's records are RELEASEd unprocessed
  (``released_rate_limit``), except a unit with a record on its last delivery (on credit).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from pyspark_kafka_share.workers.config import WorkerConfig
from pyspark_kafka_share.workers.outcome import Outcome
from pyspark_kafka_share.workers.retry import Pace
from pyspark_kafka_share.workers.verdict import MAX_ATTEMPTS_IN_PLACE, Verdict, call, call_async

__all__ = ["Done", "InFlight", "is_async"]


def is_async(fn: object) -> bool:
    """Whether ``fn`` is an ``async def`` function (or an object with an ``async`` call)."""
    call_method = vars(type(fn)).get("__call__")  # a class whose instances are called
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call_method)


@dataclass(frozen=True)
class Done:
    """A unit's completion: its records, their verdicts, when its call began and how long it
    took (monotonic seconds)."""

    unit: list[Any]
    verdicts: list[Verdict]
    began: float
    took_s: float


@dataclass
class _Running:
    unit: list[Any]
    began: float
    future: Future[Any] | None = None  # an async task's, to cancel it
    attempts: list[int] | None = None  # calls made per record in this delivery before this one


@dataclass
class _Waiting:
    """Records waiting for their retry (holding no slot): due at ``due`` (monotonic)."""

    unit: list[Any]
    verdicts: list[Verdict]  # what they settle as if the retry does not fit (RELEASE)
    due: float
    est_s: float  # the retry's estimated time (the failed call's, per record)


_Completion = tuple[int, list[Verdict] | BaseException, float, float]  # token, result, t0, t1


class InFlight:
    """Up to ``slots`` units of ``fn`` running at once; see the module docstring."""

    def __init__(self, fn: Callable[[Any], Any], config: WorkerConfig, slots: int,
                 stats: Counter[str], pace: Pace | None = None) -> None:
        """``pace``: the retry policy, the rate limit and ``attempts_allowed`` (its deadline
        is the poll's, given to :meth:`begin`); None: neither."""
        self.fn, self.config, self.slots, self.stats = fn, config, slots, stats
        self.pace = pace
        self.deadline: Callable[[], float] | None = None  # the poll's, less the settling's
        self._waiting: list[_Waiting] = []
        self._ready: list[Done] = []  # decided without a call (the rate limit's RELEASEs)
        self.asynchronous = is_async(fn)
        self._tokens = itertools.count()
        self._running: dict[int, _Running] = {}
        self._completions: queue.SimpleQueue[_Completion] = queue.SimpleQueue()
        self._jobs: queue.SimpleQueue[tuple[int, list[Any], float] | None] = \
            queue.SimpleQueue()
        self._abandoned: set[int] = set()
        self._threads = 0  # pool threads alive (a given-up unit's one ends when it returns)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._window: float | None = None  # since when the slots are counted (a poll's work)
        self._slot_s = self._capacity_s = 0.0

    @property
    def busy(self) -> int:
        """Units running (not given up): the slots taken."""
        return len(self._running)

    @property
    def pending(self) -> int:
        """Units not settled yet: running, waiting for a retry, or decided without a call."""
        return len(self._running) + len(self._waiting) + len(self._ready)

    def records(self) -> list[Any]:
        """The records of the units not settled yet (:attr:`pending`)."""
        return [m for units in ([r.unit for r in self._running.values()],
                                [w.unit for w in self._waiting], [d.unit for d in self._ready])
                for unit in units for m in unit]

    def next_wake(self) -> float | None:
        """When the first retry waiting is due (monotonic), or None."""
        return min((w.due for w in self._waiting), default=None)

    # ---- starting units and taking their completions ---------------------------------------

    def start(self, unit: list[Any], retry_of: list[Verdict] | None = None) -> None:
        """Run the function on ``unit`` (one record, or one chunk of a batch function) once
        the rate limit's tokens are there (``retry_of``: a retry's, the verdicts of its last
        call, which stand if no token comes before the deadline)."""
        assert len(self._running) < self.slots, "every slot is taken"
        self._tick()
        not_before = self._tokens_for(unit)
        if not_before is None:  # no token before the deadline: RELEASEd
            if retry_of is None:  # unprocessed
                self.stats["released_rate_limit"] += len(unit)
            self._ready.append(Done(unit, retry_of or [Verdict(Outcome.RELEASE, unprocessed=True)
                                                       for _ in unit], time.monotonic(), 0.0))
            return
        if retry_of is not None:
            self.stats["retries"] += len(unit)
        attempts = None if retry_of is None else [v.attempts for v in retry_of]
        token = next(self._tokens)
        running = _Running(unit, time.monotonic(), attempts=attempts)
        self._running[token] = running
        if self.asynchronous:
            running.future = asyncio.run_coroutine_threadsafe(
                self._acall(token, unit, not_before), self._event_loop())
            return
        with self._lock:
            spawn = self._threads < self.slots + len(self._abandoned)
            self._threads += spawn
        if spawn:
            threading.Thread(target=self._serve, daemon=True,
                             name=f"kafka-share-call-{token}").start()
        self._jobs.put((token, unit, not_before))

    def _tokens_for(self, unit: list[Any]) -> float | None:
        """When ``unit``'s call may start (monotonic), its tokens reserved; None: they would
        come after the deadline (never for a unit with a record on its last delivery)."""
        now, pace = time.monotonic(), self.pace
        if pace is None or pace.limiter is None:
            return now
        last = any(m.delivery_count() >= pace.attempts_allowed for m in unit)
        wait = pace.limiter.reserve(len(unit), deadline=self._deadline(), force=last)
        if wait is None:
            return None
        self.stats["rate_limit_wait_ms"] += int(wait * 1000)
        return now + wait

    def _deadline(self) -> float | None:
        return self.deadline() if self.deadline is not None else None

    def start_due(self) -> None:
        """Start the retries whose wait is over while a slot is free (the loop calls it
        before it starts new units)."""
        now = time.monotonic()
        for w in sorted((w for w in self._waiting if w.due <= now), key=lambda w: w.due):
            if len(self._running) >= self.slots:
                return
            self._waiting.remove(w)
            self.start(w.unit, retry_of=w.verdicts)

    def done(self, until: float) -> list[Done]:
        """The completions: waits for the first until ``until`` (monotonic), or until a
        retry's wait ends (then :meth:`start_due`), then takes every one that came meanwhile
        (nothing running: only the late results of units given up, counted and discarded; the
        loop calls it so while idle); and the retries waiting that no longer fit the deadline,
        as their RELEASEs. A unit's exception that is not
        the record's (a configuration mistake, ``KeyboardInterrupt``) is raised here."""
        out, self._ready = self._ready, []
        while True:
            due = self.next_wake()  # a retry's wait ends: the caller starts it (start_due)
            timeout = (until if due is None else min(until, due)) - time.monotonic()
            wait = (self._running or self._waiting) and not out and timeout > 0
            try:
                token, result, t0, t1 = (self._completions.get(timeout=timeout) if wait
                                         else self._completions.get_nowait())
            except queue.Empty:
                break
            self._tick()
            running = self._running.pop(token, None)
            if running is None:  # given up at its deadline: its records are back in the group
                self._abandoned.discard(token)
                self.stats["late_discarded"] += 1
                continue
            if isinstance(result, BaseException):
                raise result
            out.extend(self._unless_retried(running, result, t0, t1))
        return out + self._too_late()

    def _unless_retried(self, running: _Running, verdicts: list[Verdict], t0: float,
                        t1: float) -> list[Done]:
        """The completion of ``running``, less its records that wait for a retry."""
        unit, prior = running.unit, running.attempts or [0] * len(running.unit)
        for v, n in zip(verdicts, prior, strict=True):
            v.attempts = n + 1
        per_record_s = (t1 - t0) / len(unit)
        due = {i: t1 + wait for i, (m, v) in enumerate(zip(unit, verdicts, strict=True))
               if (wait := self._retry_wait(m, v)) is not None}
        if due and self.config.batch_format != "record":  # retried together: the longest wait
            due = dict.fromkeys(due, max(due.values()))
        retried = [i for i, at in due.items() if self._fits(at, per_record_s * len(due))]
        if retried:
            self._waiting.append(_Waiting([unit[i] for i in retried],
                                          [verdicts[i] for i in retried], due[retried[0]],
                                          per_record_s * len(retried)))
            self.stats["retry_wait_ms"] += int((due[retried[0]] - t1) * 1000)
        kept = [i for i in range(len(unit)) if i not in set(retried)]
        if not kept:
            return []
        return [Done([unit[i] for i in kept], [verdicts[i] for i in kept], t0,
                     (t1 - t0) * len(kept) / len(unit))]

    def _retry_wait(self, m: Any, v: Verdict) -> float | None:
        """The wait before ``m``'s retry (None: no retry in place)."""
        if self.pace is None or self.deadline is None or not v.retry or \
                v.outcome is not Outcome.RELEASE or v.attempts >= MAX_ATTEMPTS_IN_PLACE:
            return None
        return self.pace.wait_for(m.delivery_count() - 1 + v.attempts - 1, v.after_s)

    def _fits(self, at: float, seconds: float) -> bool:
        deadline = self._deadline()
        return deadline is None or max(time.monotonic(), at) + seconds <= deadline

    def _too_late(self) -> list[Done]:
        """The retries waiting that would no longer end before the deadline: their RELEASEs
        are settled (as one at a time)."""
        late = [w for w in self._waiting if not self._fits(w.due, w.est_s)]
        for w in late:
            self._waiting.remove(w)
        now = time.monotonic()  # their last call's time: the estimate's
        return [Done(w.unit, w.verdicts, now - w.est_s, w.est_s) for w in late]

    def abandon(self, keep: Callable[[list[Any]], bool] = lambda unit: False) -> list[Any]:
        """Give up the units running but those ``keep`` holds: async tasks are cancelled, a
        thread's late result is discarded (and its thread replaced). Their records."""
        self._tick()
        given_up: list[Any] = []
        # Not running (waiting for a retry, or decided without a call): nothing to cancel.
        units = [*(w.unit for w in self._waiting), *(d.unit for d in self._ready)]
        given_up.extend(m for unit in units if not keep(unit) for m in unit)
        self._waiting = [w for w in self._waiting if keep(w.unit)]
        self._ready = [d for d in self._ready if keep(d.unit)]
        for token, running in list(self._running.items()):
            if keep(running.unit):
                continue
            del self._running[token]
            given_up.extend(running.unit)
            if running.future is not None:
                running.future.cancel()
            else:
                self._abandoned.add(token)
        return given_up

    # ---- how full the slots stay ------------------------------------------------------------

    def begin(self, deadline: Callable[[], float] | None = None) -> None:
        """A poll's records are being worked on: the slots are counted from now. ``deadline``:
        by when the poll's records must be decided (monotonic; the pacing's bound)."""
        self._window = time.monotonic()
        self.deadline = deadline

    def end(self) -> None:
        """The poll is done: the slots' time is added to the counters."""
        self._tick()
        self._window = None
        self.stats["slot_ms"] = int(self._slot_s * 1000)
        self.stats["slot_capacity_ms"] = int(self._capacity_s * 1000)

    def _tick(self) -> None:
        """Count the slots' time up to now."""
        now = time.monotonic()
        if self._window is not None:
            dt = now - self._window
            self._slot_s += dt * len(self._running)
            self._capacity_s += dt * self.slots
            self._window = now

    # ---- the threads and the event loop ----------------------------------------------------

    def _serve(self) -> None:
        """A pool thread: runs units until told to stop, or until the unit it ran was given
        up (a replacement took its place meanwhile)."""
        while True:
            job = self._jobs.get()
            if job is None:
                return
            token, unit, not_before = job
            if not_before > time.monotonic():  # the rate limit's tokens come then
                time.sleep(not_before - time.monotonic())
            t0 = time.monotonic()
            result: list[Verdict] | BaseException
            if token in self._abandoned:  # given up before its call began: not called
                result = []
            else:
                try:
                    result = call(self.fn, unit, self.config)
                except BaseException as exc:  # noqa: BLE001 - handed to the worker's thread
                    result = exc
            given_up = token in self._abandoned  # read before the worker may forget it
            self._completions.put((token, result, t0, time.monotonic()))
            if given_up:
                with self._lock:
                    self._threads -= 1
                return

    async def _acall(self, token: int, unit: list[Any], not_before: float) -> None:
        if not_before > time.monotonic():  # the rate limit's tokens come then
            await asyncio.sleep(not_before - time.monotonic())
        t0 = time.monotonic()
        try:
            result: list[Verdict] | BaseException = await call_async(self.fn, unit, self.config)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the worker's thread
            result = exc
        self._completions.put((token, result, t0, time.monotonic()))

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, daemon=True,
                             name="kafka-share-event-loop").start()
        return self._loop

    def close(self) -> None:
        """Give up what still runs; stop the threads and the event loop."""
        self.abandon()
        for _ in range(self._threads):
            self._jobs.put(None)
        if self._loop is not None:
            loop = self._loop
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(loop.stop)
