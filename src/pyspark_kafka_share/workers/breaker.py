"""The queue workers' circuit breaker: a bad deploy must not empty the queue.

A function with a bug that raises on every record, or a result the records cannot carry,
makes every record poison: REJECTed (archived for good) or dead-lettered. That is a property
of the job, not of the records, so the breaker stops the job when, over the last
``circuit_breaker_window`` records, the share that were

- poison (REJECTed, or RELEASEd on their last allowed attempt), or
- failed with the same exception type (retried or not)

passes ``circuit_breaker`` (default :data:`DEFAULT_THRESHOLD`; None turns it off). It judges
only once it has seen :func:`min_records` of the window's records, so a few bad records at
start do not stop a job.

One rule, :class:`Breaker`, fed from two places (docs/workers.md, "Circuit breaker"):

- **each worker** (:class:`ChunkJudge`), with the verdicts of a chunk *before* they are
  settled: a chunk that trips it is not REJECTed but RELEASEd, and the worker stops. Reports
  reach the driver every second at best, in which one worker can settle thousands of records;
  judged before settling, a job of all-failing records loses none to the breaker's delay.
- **the driver** (:class:`JobBreaker`), with the sums of the workers' reports: job-wide, for
  workers that each see too few records to judge, and the one that stops the whole job.

Pure logic, no Spark, no Kafka: unit-tested in tests/unit/test_workers_breaker.py.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pyspark_kafka_share.errors import OptionError

__all__ = ["DEFAULT_THRESHOLD", "DEFAULT_WINDOW", "Breaker", "ChunkJudge", "JobBreaker", "Trip",
           "check_breaker", "min_records"]

DEFAULT_THRESHOLD = 0.5
"""Trip when more than half of the window's records are poison or fail with the same
exception type (exactly half does not trip: a queue with every other record poison runs)."""
DEFAULT_WINDOW = 100
"""Records the breaker looks back over."""


def check_breaker(threshold: object, window: object) -> None:
    """The options ``circuit_breaker`` and ``circuit_breaker_window``."""
    if threshold is not None and (not isinstance(threshold, int | float) or
                                  isinstance(threshold, bool) or not 0 <= threshold < 1):
        raise OptionError("circuit_breaker", threshold,
                          f"a share from 0 up to (not including) 1, e.g. {DEFAULT_THRESHOLD} "
                          "(the default), or None to turn the circuit breaker off")
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise OptionError("circuit_breaker_window", window,
                          f"a whole number of records >= 1, e.g. {DEFAULT_WINDOW} (the "
                          "default)")


def min_records(window: int) -> int:
    """Records the breaker must have seen in its window before it judges (a fifth of it)."""
    return max(1, window // 5)


@dataclass(frozen=True)
class Trip:
    """Why the breaker tripped: the cause and the window's counts."""

    cause: str
    """``poison`` or the exception type's name."""
    count: int
    seen: int
    threshold: float

    def message(self, where: str) -> str:
        what = ("were rejected or dead-lettered" if self.cause == "poison"
                else f"failed with {self.cause}")
        return (f"circuit breaker tripped ({where}): {self.count} of the last {self.seen} "
                f"records {what} (more than {self.threshold:.0%}: circuit_breaker; "
                "circuit_breaker=None turns it off). A mistake in the job is not the records' "
                "fault: fix the function or its configuration and run again; the records "
                "held were RELEASEd")


@dataclass
class Breaker:
    """The rule over a window of records: buckets of (records, poison, failures by type)."""

    threshold: float | None = DEFAULT_THRESHOLD
    window: int = DEFAULT_WINDOW
    _buckets: deque[tuple[int, int, Counter[str]]] = field(default_factory=deque)

    def add(self, records: int, poison: int, failures: Mapping[str, int]) -> Trip | None:
        """Add a bucket; the trip if the window now passes the threshold."""
        if self.threshold is None or records <= 0:
            return None
        self._buckets.append((records, poison, Counter(failures)))
        # Keep the newest buckets that hold the window (the last one may overlap it).
        while len(self._buckets) > 1 and \
                sum(n for n, _, _ in self._buckets) - self._buckets[0][0] >= self.window:
            self._buckets.popleft()
        return self.judge()

    def judge(self) -> Trip | None:
        if self.threshold is None:
            return None
        seen = sum(n for n, _, _ in self._buckets)
        if seen < min_records(self.window):
            return None
        poison = sum(p for _, p, _ in self._buckets)
        by_type: Counter[str] = Counter()
        for _, _, failures in self._buckets:
            by_type.update(failures)
        worst = by_type.most_common(1)
        if worst and worst[0][1] > self.threshold * seen:  # the more specific cause first
            return Trip(worst[0][0], worst[0][1], seen, self.threshold)
        if poison > self.threshold * seen:
            return Trip("poison", poison, seen, self.threshold)
        return None


class ChunkJudge:
    """A worker's breaker, fed one chunk's verdicts before they are settled."""

    def __init__(self, threshold: float | None, window: int) -> None:
        self.breaker = Breaker(threshold, window)
        self.failures: Counter[str] = Counter()
        """Every failure by exception type so far (reported to the driver)."""
        self.trip: Trip | None = None

    def judge(self, verdicts: Iterable[tuple[bool, str | None]]) -> Trip | None:
        """``verdicts``: per record, (poison, the exception type if the function raised).
        Once tripped, stays tripped."""
        rows = list(verdicts)
        failures = Counter(t for _, t in rows if t is not None)
        self.failures.update(failures)
        trip = self.breaker.add(len(rows), sum(1 for p, _ in rows if p), failures)
        if self.trip is None:
            self.trip = trip
        return self.trip


class JobBreaker:
    """The driver's breaker, fed the sums of the workers' reports (every attempt's)."""

    def __init__(self, threshold: float | None, window: int) -> None:
        self.breaker = Breaker(threshold, window)
        self._last: tuple[int, int, Counter[str]] = (0, 0, Counter())
        self.trip: Trip | None = None

    def observe(self, reports: Iterable[Mapping[str, object]]) -> Trip | None:
        processed, rejected, failures = 0, 0, Counter[str]()
        for r in reports:
            processed += _int(r.get("processed"))
            rejected += _int(r.get("rejected"))
            raw = r.get("failures")
            if isinstance(raw, Mapping):
                failures.update({str(k): _int(v) for k, v in raw.items()})
        n0, p0, f0 = self._last
        self._last = (processed, rejected, failures)
        delta = Counter({k: v - f0.get(k, 0) for k, v in failures.items() if v > f0.get(k, 0)})
        trip = self.breaker.add(processed - n0, max(0, rejected - p0), delta)
        if self.trip is None:
            self.trip = trip
        return self.trip


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
