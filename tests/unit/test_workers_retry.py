"""Retries that wait, the rate limit and the recoverer (issue 40): ``workers/retry.py`` and
``verdict.call`` on scripted messages, with a fake clock (pure unit tests, no broker)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from pyspark_kafka_share.errors import OptionError
from pyspark_kafka_share.workers.config import WorkerConfig
from pyspark_kafka_share.workers.mistakes import JobMistake
from pyspark_kafka_share.workers.outcome import Outcome, Record, Result
from pyspark_kafka_share.workers.retry import (
    Backoff,
    Pace,
    TokenBucket,
    check_backoff,
    check_rate_limit,
    worker_rate,
)
from pyspark_kafka_share.workers.verdict import Verdict, call

from .fakes import Msg


class Clock:
    """A fake monotonic clock; sleeping advances it (and is recorded)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(round(s, 6))
        self.now += s


def _config(**kw: Any) -> WorkerConfig:
    base: dict[str, Any] = {"bootstrap_servers": "unused:9092", "group": "g", "topics": ("in",),
                            "retry_on": (TimeoutError,), "output_topic": "out"}
    base.update(kw)
    return WorkerConfig(**base)


def _pace(clock: Clock, *, deadline_in: float | None = 30.0, **kw: Any) -> Pace:
    return Pace(deadline=None if deadline_in is None else clock.now + deadline_in,
                clock=clock, sleep=clock.sleep, rng=random.Random(7), **kw)


def _flaky(fails: int, exc: Callable[[], Exception] = lambda: TimeoutError("503")) \
        -> tuple[Callable[[Record], Any], dict[int, int]]:
    """A function failing ``fails`` times per record, then ACCEPTing; its calls by offset."""
    calls: dict[int, int] = {}

    def fn(r: Record) -> Any:
        calls[r.offset] = calls.get(r.offset, 0) + 1
        if calls[r.offset] <= fails:
            raise exc()
        return None

    return fn, calls


# ---- the policy ------------------------------------------------------------------------------


def test_backoff_grows_to_its_cap_and_jitter_only_shortens() -> None:
    b = Backoff(initial_s=1.0, max_s=5.0, multiplier=2.0, jitter=0.0)
    assert [b.delay(n) for n in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert b.delay(100_000) == 5.0  # no overflow for a long-failing record
    jittered = Backoff(initial_s=1.0, max_s=5.0, multiplier=2.0, jitter=0.5)
    waits = [jittered.delay(3, random.Random(seed)) for seed in range(50)]
    assert all(2.0 <= w <= 4.0 for w in waits) and len(set(waits)) > 40


@pytest.mark.parametrize("bad", [Backoff(initial_s=0), Backoff(initial_s=5, max_s=1),
                                 Backoff(multiplier=0.5), Backoff(jitter=1.0), 3.0])
def test_a_bad_backoff_is_refused_naming_the_option(bad: object) -> None:
    with pytest.raises(OptionError, match="retry_backoff"):
        check_backoff(bad)


@pytest.mark.parametrize("bad", [0, -1, True, "10", float("inf")])
def test_a_bad_rate_limit_is_refused(bad: object) -> None:
    with pytest.raises(OptionError, match="rate_limit"):
        check_rate_limit(bad)


def test_the_options_are_checked_when_the_config_is_built() -> None:
    with pytest.raises(OptionError, match="retry_backoff"):
        WorkerConfig.create(topics="in", group="g", bootstrap_servers="b:9092",
                            retry_backoff=Backoff(initial_s=-1))
    with pytest.raises(OptionError, match="give recoverer or retry_on, not both"):
        WorkerConfig.create(topics="in", group="g", bootstrap_servers="b:9092",
                            retry_on=(TimeoutError,), recoverer=lambda e, r: Outcome.REJECT)
    config = WorkerConfig.create(topics="in", group="g", bootstrap_servers="b:9092",
                                 retry_backoff=Backoff(), rate_limit=40)
    assert config.retry_backoff == Backoff() and config.rate_limit == 40


# ---- the rate limit --------------------------------------------------------------------------


def test_the_job_rate_is_split_across_the_workers() -> None:
    assert worker_rate(100.0, 4) == 25.0


def test_a_token_bucket_spaces_calls_out_after_its_burst() -> None:
    clock = Clock()
    bucket = TokenBucket(2.0, clock=clock, sleep=clock.sleep)
    waits = [bucket.take() for _ in range(5)]
    assert waits == [0.0, 0.0, 0.5, 0.5, 0.5]  # a burst of 2, then one each 0.5 s
    assert clock.now == pytest.approx(101.5)


def test_a_token_past_the_deadline_is_not_taken_unless_forced() -> None:
    clock = Clock()
    bucket = TokenBucket(1.0, clock=clock, sleep=clock.sleep)
    assert bucket.take() == 0.0
    assert bucket.take(deadline=clock.now + 0.5) is None and clock.slept == []
    assert bucket.take(deadline=clock.now + 0.5, force=True) == 1.0  # on credit
    assert bucket.take(3, deadline=clock.now + 2.5) is None  # 3 tokens take 3 s
    assert bucket.take(3) == 3.0


def test_the_rate_limit_releases_what_it_cannot_serve_before_the_deadline() -> None:
    clock = Clock()
    pace = _pace(clock, deadline_in=2.2, limiter=TokenBucket(1.0, clock=clock,
                                                             sleep=clock.sleep),
                 attempts_allowed=3)
    seen: list[int] = []
    chunk = [Msg(0), Msg(1), Msg(2), Msg(3), Msg(4, dc=3)]
    verdicts = call(lambda r: seen.append(r.offset), chunk, _config(), pace)
    # 1 at once, then one a second: 0, 1 (1 s), 2 (2 s); 3 would come at 3 s, after the
    # deadline: RELEASEd unprocessed; 4 is on its last delivery: served on credit.
    assert seen == [0, 1, 2, 4]
    assert [v.outcome for v in verdicts] == [Outcome.ACCEPT] * 3 + [Outcome.RELEASE,
                                                                    Outcome.ACCEPT]
    assert verdicts[3].unprocessed and pace.counts["released_rate_limit"] == 1
    assert pace.counts["rate_limit_wait_ms"] == 3000


def test_a_batch_function_takes_a_token_per_row() -> None:
    clock = Clock()
    pace = _pace(clock, limiter=TokenBucket(10.0, clock=clock, sleep=clock.sleep))
    call(lambda t: None, [Msg(i) for i in range(30)], _config(batch_format="arrow"), pace)
    assert clock.slept == [2.0]  # 30 rows at 10/s with a burst of 10


# ---- retries in place ------------------------------------------------------------------------


def test_without_a_policy_a_retryable_failure_is_released_at_once() -> None:
    clock = Clock()
    fn, calls = _flaky(1)
    (v,) = call(fn, [Msg(0)], _config(), _pace(clock))
    assert (v.outcome, v.retry, calls, clock.slept) == (Outcome.RELEASE, True, {0: 1}, [])
    assert "TimeoutError: 503" in (v.error or "")


def test_a_503_for_a_while_is_waited_out_then_accepted() -> None:
    clock = Clock()
    fn, calls = _flaky(3)
    pace = _pace(clock, backoff=Backoff(initial_s=1.0, max_s=8.0, jitter=0.0))
    (v,) = call(fn, [Msg(0)], _config(), pace)
    assert (v.outcome, v.attempts, calls) == (Outcome.ACCEPT, 4, {0: 4})
    assert clock.slept == [1.0, 2.0, 4.0]
    assert (pace.counts["retries"], pace.counts["retry_wait_ms"]) == (3, 7000)


def test_records_failing_together_wait_together() -> None:
    clock = Clock()
    fn, calls = _flaky(1)
    pace = _pace(clock, backoff=Backoff(initial_s=1.0, jitter=0.0))
    verdicts = call(fn, [Msg(i) for i in range(5)], _config(), pace)
    assert {v.outcome for v in verdicts} == {Outcome.ACCEPT} and clock.slept == [1.0]
    assert pace.counts["retries"] == 5 and calls == dict.fromkeys(range(5), 2)


def test_the_backoff_goes_on_from_the_earlier_deliveries() -> None:
    clock = Clock()
    fn, _ = _flaky(1)
    call(fn, [Msg(0, dc=3)], _config(),
         _pace(clock, backoff=Backoff(initial_s=1.0, multiplier=3.0, max_s=100, jitter=0.0)))
    assert clock.slept == [9.0]  # its third delivery: the third wait, not the first


def test_retries_stop_before_the_lock_deadline_and_the_record_is_released() -> None:
    clock = Clock()
    fn, calls = _flaky(100)
    pace = _pace(clock, deadline_in=10.0, backoff=Backoff(initial_s=1.0, jitter=0.0))
    (v,) = call(fn, [Msg(0)], _config(), pace)
    # Waits of 1, 2, 4 (7 s); the next (8 s) would end past the deadline: RELEASE.
    assert (v.outcome, v.retry, calls[0]) == (Outcome.RELEASE, True, 4)
    assert sum(clock.slept) == 7.0 and clock.now <= pace.deadline  # type: ignore[operator]


def test_no_deadline_means_no_retry_in_place() -> None:
    clock = Clock()
    fn, calls = _flaky(1)
    (v,) = call(fn, [Msg(0)], _config(), _pace(clock, deadline_in=None, backoff=Backoff()))
    assert (v.outcome, calls, clock.slept) == (Outcome.RELEASE, {0: 1}, [])


def test_a_function_names_its_wait_with_result_retry() -> None:
    clock = Clock()
    answers = iter([Result.retry(after=3.0, error="429"), Result.accept("done")])
    (v,) = call(lambda r: next(answers), [Msg(0)], _config(), _pace(clock))
    assert (v.outcome, v.value, clock.slept) == (Outcome.ACCEPT, b"done", [3.0])
    # Result.release() is a plain RELEASE: no retry in place, even with a policy.
    clock2 = Clock()
    (w,) = call(lambda r: Result.release("not mine"), [Msg(0)], _config(),
                _pace(clock2, backoff=Backoff()))
    assert (w.outcome, w.retry, clock2.slept) == (Outcome.RELEASE, False, [])


def test_a_retry_that_would_end_past_the_deadline_is_not_waited_for() -> None:
    clock = Clock()
    (v,) = call(lambda r: Result.retry(after=60.0), [Msg(0)], _config(), _pace(clock))
    assert (v.outcome, clock.slept) == (Outcome.RELEASE, [])


def test_a_batch_function_is_called_again_on_the_rows_that_asked() -> None:
    clock = Clock()
    tables: list[list[int]] = []

    def fn(table: Any) -> list[Any]:
        offsets = table.column("offset").to_pylist()
        tables.append(offsets)
        return [Result.retry(after=1.0) if o % 2 and len(tables) == 1 else None
                for o in offsets]

    verdicts = call(fn, [Msg(i) for i in range(4)], _config(batch_format="arrow"),
                    _pace(clock))
    assert tables == [[0, 1, 2, 3], [1, 3]] and clock.slept == [1.0]
    assert {v.outcome for v in verdicts} == {Outcome.ACCEPT}


def test_a_busy_retry_loop_is_bounded() -> None:
    clock = Clock()
    calls: list[int] = []

    def fn(r: Record) -> Result:
        calls.append(r.offset)
        clock.now += 0.001
        return Result.retry(after=0)

    (v,) = call(fn, [Msg(0)], _config(), _pace(clock))
    assert v.outcome is Outcome.RELEASE and len(calls) == 100


# ---- the recoverer ---------------------------------------------------------------------------


def test_the_default_recoverer_is_retry_on() -> None:
    config = _config(retry_on=(TimeoutError,))
    verdicts = call(_raiser({0: TimeoutError("t"), 1: KeyError("k")}), [Msg(0), Msg(1)],
                    config)
    assert [(v.outcome, v.error_type) for v in verdicts] == \
        [(Outcome.RELEASE, "TimeoutError"), (Outcome.REJECT, "KeyError")]


def _raiser(by_offset: dict[int, Exception]) -> Callable[[Record], None]:
    def fn(r: Record) -> None:
        raise by_offset[r.offset]
    return fn


def test_a_recoverer_maps_exceptions_to_outcomes() -> None:
    seen: list[tuple[str, int]] = []

    def recoverer(exc: Exception, record: Record) -> Outcome | Result:
        seen.append((type(exc).__name__, record.offset))
        if isinstance(exc, ValueError):
            return Outcome.ACCEPT  # e.g. a duplicate the service already has
        if isinstance(exc, KeyError):
            return Result.reject("schema drift")
        return Outcome.RELEASE

    clock = Clock()
    config = _config(retry_on=(Exception,), recoverer=recoverer)
    fn = _raiser({0: ValueError("dup"), 1: KeyError("k"), 2: ConnectionError("down")})
    verdicts = call(fn, [Msg(0), Msg(1), Msg(2)], config,
                    _pace(clock, deadline_in=1.0, backoff=Backoff(initial_s=0.4, jitter=0)))
    assert [(v.outcome, v.error, v.error_type) for v in verdicts] == [
        (Outcome.ACCEPT, None, None),
        (Outcome.REJECT, "schema drift", "KeyError"),
        (Outcome.RELEASE, "ConnectionError: down", "ConnectionError")]
    # The recoverer's RELEASE is a retry, waited by the policy (0.4 s, then 0.8 s: too late).
    assert verdicts[2].retry and clock.slept == [0.4]
    assert seen == [("ValueError", 0), ("KeyError", 1), ("ConnectionError", 2),
                    ("ConnectionError", 2)]


def test_a_recoverer_that_raises_is_the_jobs_mistake() -> None:
    def recoverer(exc: Exception, record: Record) -> Outcome:
        raise RuntimeError("bug in the recoverer")

    config = _config(retry_on=(Exception,), recoverer=recoverer)
    with pytest.raises(JobMistake, match="the recoverer raised RuntimeError") as err:
        call(_raiser({0: KeyError("k")}), [Msg(0)], config)
    assert err.value.option == "recoverer"
    with pytest.raises(JobMistake, match="returned int"):
        call(_raiser({0: KeyError("k")}), [Msg(0)],
             _config(retry_on=(Exception,), recoverer=lambda e, r: 42))


def test_a_batch_functions_exception_is_recovered_per_row() -> None:
    config = _config(retry_on=(Exception,), batch_format="arrow",
                     recoverer=lambda e, r: Outcome.REJECT if r.offset else Outcome.ACCEPT)

    def fn(table: Any) -> None:
        raise OSError("all rows")

    verdicts = call(fn, [Msg(0), Msg(1)], config)
    assert [v.outcome for v in verdicts] == [Outcome.ACCEPT, Outcome.REJECT]
    assert isinstance(verdicts[1], Verdict) and verdicts[1].error == "OSError: all rows"


def test_the_summary_sums_and_prints_the_pacing_counters() -> None:
    from pyspark_kafka_share.workers.api import WorkerSummary, _totals

    reports: list[dict[str, Any]] = [
        {"worker": 0, "attempt": 0, "retries": 3, "retry_wait_ms": 700, "undecodable": 1},
        {"worker": 1, "attempt": 0, "retries": 2, "retry_wait_ms": 300,
         "rate_limit_wait_ms": 50, "released_rate_limit": 4}]
    totals = _totals(reports)
    assert (totals["retries"], totals["retry_wait_ms"], totals["released_rate_limit"]) == \
        (5, 1000, 4)
    assert ("retries in place=5 (waited 1000 ms) rate limit waits=50 ms released by the rate "
            "limit=4 undecodable=1") in str(WorkerSummary(1.0, "idle timeout", totals, reports))
    # None of them: no line.
    assert "retries in place" not in str(WorkerSummary(1.0, "idle timeout", _totals([{}])))
