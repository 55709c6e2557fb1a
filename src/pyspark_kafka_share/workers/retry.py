"""Retries that wait, and a rate limit: the pacing of the calls of a worker's function.

:class:`Backoff` is the per-record policy of ``run_workers(retry_backoff=...)``: how long a
record that asked for a retry (an exception of a ``retry_on`` type, a recoverer's RELEASE,
``Result.retry()``) waits before the worker calls the function on it again, exponential with
jitter and a cap. The worker retries in place only while the record's lock allows (never past
its poll's safety deadline, see :meth:`Pace.fits`); then the record is RELEASEd, which the
broker redelivers at once: longer waits need a lock that is renewed (RENEW), not a longer
backoff. ``Result.retry(after=seconds)`` (a ``Retry-After``) replaces the policy's wait.

:class:`TokenBucket` is ``rate_limit``: records per second for the whole job, each worker's
bucket holding ``rate_limit / workers`` of it (:func:`worker_rate`); a call takes a token per
record before the function runs, waiting for one, or (when none would come before the
deadline) the record is RELEASEd unprocessed.

:class:`Pace` carries both, the deadline and the counters of one call of
:func:`~pyspark_kafka_share.workers.verdict.call`. Pure logic (a clock, a sleep and a random
source are injected): unit-tested in tests/unit/test_workers_retry.py.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark_kafka_share.errors import OptionError

__all__ = ["Backoff", "Pace", "TokenBucket", "check_backoff", "check_rate_limit",
           "worker_rate"]

Clock = Callable[[], float]
Sleep = Callable[[float], None]


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter and a cap: the ``n``-th wait (1-based) is
    ``min(max_s, initial_s * multiplier ** (n - 1))``, shortened by up to ``jitter`` of it
    (a random share, so records failing together do not come back together).

    ``n`` counts a record's retries over all its deliveries: the first retry of its second
    delivery waits as the second of the first (the broker redelivers a RELEASEd record at
    once, so a backoff that started over on each delivery would not back off)."""

    initial_s: float = 0.5
    max_s: float = 10.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def delay(self, n: int, rng: random.Random | None = None) -> float:
        """The wait before the ``n``-th retry (``n >= 1``)."""
        exponent = max(0, n - 1)
        # multiplier ** exponent overflows for a long-failing record: cap the exponent first.
        if self.multiplier > 1 and exponent > math.log(self.max_s / self.initial_s,
                                                      self.multiplier) + 1:
            base = self.max_s
        else:
            base = min(self.max_s, self.initial_s * self.multiplier ** exponent)
        shave = (rng or random).random() * self.jitter
        return base * (1 - shave)


def check_backoff(value: object) -> None:
    """The option ``retry_backoff``: None or a :class:`Backoff` with sane numbers."""
    if value is None:
        return
    if not isinstance(value, Backoff):
        raise OptionError("retry_backoff", value, "give a Backoff(initial_s=..., max_s=..., "
                          "multiplier=..., jitter=...) or None (RELEASE at once, today's "
                          "behaviour)")
    numbers = (value.initial_s, value.max_s, value.multiplier, value.jitter)
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in numbers) or \
            not 0 < value.initial_s <= value.max_s or value.multiplier < 1 or \
            not 0 <= value.jitter < 1:
        raise OptionError("retry_backoff", value, "needs 0 < initial_s <= max_s, multiplier "
                          ">= 1 and 0 <= jitter < 1, e.g. Backoff(initial_s=0.5, max_s=10, "
                          "multiplier=2, jitter=0.2)")


def check_rate_limit(value: object) -> None:
    """The option ``rate_limit``: None or records per second > 0, for the whole job."""
    if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)
                              or not 0 < value < math.inf):
        raise OptionError("rate_limit", value, "records per second for the whole job (> 0, "
                          "split evenly across the workers), or None for no limit")


def worker_rate(rate_limit: float, workers: int) -> float:
    """Each worker's share of the job's ``rate_limit`` (records/s)."""
    return rate_limit / workers


class TokenBucket:
    """A token bucket of ``rate`` tokens per second holding at most ``burst`` (at least one;
    full at start). Thread-safe: a take reserves its tokens under a lock, then sleeps outside
    it, so concurrent callers are spaced out, not woken together."""

    def __init__(self, rate: float, burst: float | None = None, *,
                 clock: Clock = time.monotonic, sleep: Sleep = time.sleep) -> None:
        self.rate = rate
        self.burst = max(1.0, burst if burst is not None else rate)
        self._clock, self._sleep = clock, sleep
        self._tokens = self.burst
        self._at = clock()
        self._lock = threading.Lock()

    def take(self, n: int = 1, *, deadline: float | None = None,
             force: bool = False) -> float | None:
        """Take ``n`` tokens; the seconds waited for them. None (and nothing taken) when they
        would come after ``deadline`` (monotonic), unless ``force``: then they are taken on
        credit (the bucket goes below zero and the next takers wait for it)."""
        wait = self.reserve(n, deadline=deadline, force=force)
        if wait:
            self._sleep(wait)
        return wait

    def reserve(self, n: int = 1, *, deadline: float | None = None,
                force: bool = False) -> float | None:
        """:meth:`take` without the sleep: the tokens are the caller's, to use once the
        seconds returned have passed (the calls in flight start then, without blocking the
        worker's thread); None as :meth:`take`."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
            self._at = now
            wait = max(0.0, (n - self._tokens) / self.rate)
            if wait > 0 and deadline is not None and now + wait > deadline and not force:
                return None
            self._tokens -= n
        return wait


@dataclass
class Pace:
    """What bounds one call of the function over a chunk: the time by which its records must
    be decided (``deadline``, monotonic: the poll's safety deadline less the settling's
    time; None: no bound), the retry policy, the job's rate limit and the counters of what
    the pacing did (merged into the worker's: ``retries``, ``retry_wait_ms``,
    ``rate_limit_wait_ms``, ``released_rate_limit``)."""

    deadline: float | None = None
    backoff: Backoff | None = None
    limiter: TokenBucket | None = None
    attempts_allowed: int = 1_000_000
    """Deliveries a record gets: one on its last is never RELEASEd by the pacing."""
    clock: Clock = time.monotonic
    sleep: Sleep = time.sleep
    rng: random.Random = field(default_factory=random.Random)
    counts: Counter[str] = field(default_factory=Counter)

    def fits(self, at: float, seconds: float) -> bool:
        """Whether work of ``seconds`` starting at ``at`` ends before the deadline."""
        return self.deadline is None or at + seconds <= self.deadline

    def wait_for(self, retries_so_far: int, after_s: float | None) -> float | None:
        """The wait before a record's next retry: ``after_s`` if the function named one, else
        the policy's (``retries_so_far`` over all deliveries); None: no retry in place."""
        if after_s is not None:
            return max(0.0, after_s)
        if self.backoff is None:
            return None
        return self.backoff.delay(retries_so_far + 1, self.rng)

    def pause(self, seconds: float) -> None:
        """Sleep before a retry (counted in ``retry_wait_ms``)."""
        if seconds > 0:
            self.sleep(seconds)
            self.counts["retry_wait_ms"] += int(seconds * 1000)

    def tokens(self, n: int, *, last_delivery: bool) -> bool:
        """Take ``n`` tokens of the rate limit (counted in ``rate_limit_wait_ms``); False
        when they would come after the deadline (the records are then RELEASEd unprocessed;
        never one on its ``last_delivery``: it takes them on credit)."""
        if self.limiter is None:
            return True
        waited = self.limiter.take(n, deadline=self.deadline, force=last_delivery)
        if waited is None:
            return False
        self.counts["rate_limit_wait_ms"] += int(waited * 1000)
        return True
