"""Many calls in flight in one worker (``concurrency``, issue 40): the executor
(``workers/inflight.py``) on its own, then the worker loop driving it against a scripted
consumer and producer (no broker). The broker-side behaviour is in
tests/integration/test_workers_concurrency.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pyspark_kafka_share._kafka.share import ShareSession
from pyspark_kafka_share.errors import OptionError
from pyspark_kafka_share.workers import mistakes
from pyspark_kafka_share.workers.api import WorkerSummary, _totals
from pyspark_kafka_share.workers.config import WorkerConfig, WorkerSpec
from pyspark_kafka_share.workers.inflight import Done, InFlight, is_async
from pyspark_kafka_share.workers.loop import _Worker
from pyspark_kafka_share.workers.outcome import Outcome, Record, Result
from pyspark_kafka_share.workers.retry import Backoff, Pace, TokenBucket

from .fakes import FakeConsumer, FakeProducer, Msg

_WAIT_S = 20.0  # only guards a hang: every wait below ends on a condition


def _config(**kw: Any) -> WorkerConfig:
    base: dict[str, Any] = {
        "bootstrap_servers": "unused:9092", "group": "g", "topics": ("in",),
        "chunk_size": 2, "max_attempts": 3, "retry_on": (TimeoutError,),
        "output_topic": "out", "dead_letter_topic": "dlq", "time_budget_s": 1.0}
    base.update(kw)
    return WorkerConfig(**base)


def _collect(inflight: InFlight, n: int) -> list[Done]:
    """Completions until ``n`` came (or the guard ran out)."""
    out: list[Done] = []
    end = time.monotonic() + _WAIT_S
    while len(out) < n and time.monotonic() < end:
        out.extend(inflight.done(until=end))
    return out


# ---- the executor --------------------------------------------------------------------------

def test_a_plain_function_runs_on_as_many_threads_as_slots() -> None:
    barrier = threading.Barrier(4, timeout=_WAIT_S)  # broken (an error) unless 4 run at once

    def fn(r: Record) -> bytes:
        barrier.wait()
        return b"%d" % r.offset

    inflight = InFlight(fn, _config(), 4, Counter())
    for i in range(4):
        inflight.start([Msg(i)])
    done = _collect(inflight, 4)
    assert sorted(d.verdicts[0].value or b"" for d in done) == [b"0", b"1", b"2", b"3"]
    assert inflight.busy == 0 and not inflight.asynchronous
    inflight.close()


def test_an_async_function_runs_its_calls_on_one_event_loop_at_once() -> None:
    threads: set[int] = set()
    arrived = 0
    everyone: asyncio.Event | None = None

    async def fn(r: Record) -> bytes:
        nonlocal arrived, everyone
        threads.add(threading.get_ident())
        everyone = everyone or asyncio.Event()
        arrived += 1
        if arrived == 8:
            everyone.set()
        await asyncio.wait_for(everyone.wait(), _WAIT_S)  # a TimeoutError unless 8 wait at once
        return b"%d" % r.offset

    assert is_async(fn)
    inflight = InFlight(fn, _config(), 8, Counter())
    for i in range(8):
        inflight.start([Msg(i)])
    done = _collect(inflight, 8)
    assert sorted(int(d.verdicts[0].value or b"") for d in done) == list(range(8))
    assert len(threads) == 1 and threads != {threading.get_ident()}
    inflight.close()


def test_an_async_call_method_counts_as_async() -> None:
    class Scorer:
        async def __call__(self, r: Record) -> None:
            return None

    assert is_async(Scorer()) and not is_async(lambda r: None)


def test_a_slow_unit_does_not_hold_back_the_others() -> None:
    release = threading.Event()

    def fn(r: Record) -> None:
        if r.offset == 0:
            assert release.wait(_WAIT_S)

    inflight = InFlight(fn, _config(), 4, Counter())
    for i in range(4):
        inflight.start([Msg(i)])
    fast = _collect(inflight, 3)
    assert sorted(d.unit[0].offset() for d in fast) == [1, 2, 3] and inflight.busy == 1
    release.set()
    assert [d.unit[0].offset() for d in _collect(inflight, 1)] == [0]
    inflight.close()


def test_a_thread_given_up_is_replaced_and_its_late_result_discarded() -> None:
    stats: Counter[str] = Counter()
    release = threading.Event()

    def fn(r: Record) -> None:
        if r.offset == 0:
            assert release.wait(_WAIT_S)

    inflight = InFlight(fn, _config(), 2, stats)
    inflight.start([Msg(0)])
    inflight.start([Msg(1)])
    assert [d.unit[0].offset() for d in _collect(inflight, 1)] == [1]
    given_up = inflight.abandon()
    assert [m.offset() for m in given_up] == [0] and inflight.busy == 0
    # Both slots are free again although offset 0 still runs on its thread.
    barrier = threading.Barrier(2, timeout=_WAIT_S)

    def fn2(r: Record) -> None:
        if r.offset in (2, 3):
            barrier.wait()

    inflight.fn = fn2
    inflight.start([Msg(2)])
    inflight.start([Msg(3)])
    assert sorted(d.unit[0].offset() for d in _collect(inflight, 2)) == [2, 3]
    release.set()  # the late result comes back: counted, never handed out
    end = time.monotonic() + _WAIT_S
    while stats["late_discarded"] == 0 and time.monotonic() < end:
        inflight.start([Msg(4)])
        assert [d.unit[0].offset() for d in _collect(inflight, 1)] == [4]
    assert stats["late_discarded"] == 1
    inflight.close()


def test_an_async_task_given_up_is_cancelled() -> None:
    cancelled = threading.Event()

    async def fn(r: Record) -> None:
        try:
            await asyncio.sleep(_WAIT_S)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    inflight = InFlight(fn, _config(), 2, Counter())
    inflight.start([Msg(0)])
    assert [m.offset() for m in inflight.abandon()] == [0]
    assert cancelled.wait(_WAIT_S)
    inflight.close()


def test_exceptions_are_verdicts_and_a_mistake_is_raised_in_the_worker() -> None:
    def fn(r: Record) -> Any:
        if r.offset == 0:
            raise TimeoutError("slow")
        if r.offset == 1:
            raise KeyError("bug")
        return 42  # not a result: the job's mistake

    inflight = InFlight(fn, _config(), 3, Counter())
    inflight.start([Msg(0)])
    inflight.start([Msg(1)])
    outcomes = {d.unit[0].offset(): d.verdicts[0].outcome for d in _collect(inflight, 2)}
    assert outcomes == {0: Outcome.RELEASE, 1: Outcome.REJECT}
    inflight.start([Msg(2)])
    with pytest.raises(mistakes.JobMistake, match="returned int"):
        _collect(inflight, 1)
    inflight.close()


def test_a_batch_function_gets_one_chunk_per_unit() -> None:
    def fn(table: Any) -> list[bytes]:
        return [b"%d" % o for o in table.column("offset").to_pylist()]

    inflight = InFlight(fn, _config(batch_format="arrow"), 2, Counter())
    inflight.start([Msg(0), Msg(1)])
    inflight.start([Msg(2), Msg(3)])
    got = sorted(v.value or b"" for d in _collect(inflight, 2) for v in d.verdicts)
    assert got == [b"0", b"1", b"2", b"3"]
    inflight.close()


def test_the_slots_time_is_counted_while_a_poll_is_worked_on() -> None:
    stats: Counter[str] = Counter()
    release = threading.Event()

    def fn(r: Record) -> None:
        release.wait(_WAIT_S)

    inflight = InFlight(fn, _config(), 4, stats)
    inflight.begin()
    inflight.start([Msg(0)])
    inflight.start([Msg(1)])
    time.sleep(0.2)  # two of four slots busy for a while: the share is measured, not awaited
    release.set()
    _collect(inflight, 2)
    inflight.end()
    assert 0 < stats["slot_ms"] <= stats["slot_capacity_ms"]
    assert stats["slot_ms"] / stats["slot_capacity_ms"] <= 0.5 + 1e-9
    inflight.close()


# ---- pacing the calls in flight (retry_backoff, Result.retry, rate_limit) ----------------------

def _drive(inflight: InFlight, n: int) -> list[Done]:
    """As the loop does: the retries whose wait is over started, completions taken, until
    ``n`` records were settled (or the guard ran out)."""
    out: list[Done] = []
    end = time.monotonic() + _WAIT_S
    while sum(len(d.unit) for d in out) < n and time.monotonic() < end:
        inflight.start_due()
        wake = inflight.next_wake()
        out.extend(inflight.done(until=min(end, wake if wake is not None else end)))
    return out


def test_a_retry_waits_without_a_slot_and_runs_once_its_wait_is_over() -> None:
    stats: Counter[str] = Counter()
    calls: list[tuple[int, float]] = []

    def fn(r: Record) -> Any:
        calls.append((r.offset, time.monotonic()))
        if r.offset == 0 and sum(1 for o, _ in calls if o == 0) == 1:
            return Result.retry(after=0.3)
        return b"ok"

    pace = Pace(backoff=Backoff(initial_s=5.0, max_s=5.0))  # after= replaces the policy
    inflight = InFlight(fn, _config(), 1, stats, pace)
    inflight.begin(deadline=lambda: time.monotonic() + 10)
    inflight.start([Msg(0)])
    assert inflight.done(until=time.monotonic() + _WAIT_S) == []  # waits: nothing settled
    assert (inflight.busy, inflight.pending) == (0, 1)  # and holds no slot
    assert [m.offset() for m in inflight.records()] == [0]
    inflight.start([Msg(1)])  # the one slot runs another record meanwhile
    done = _drive(inflight, 2)
    assert [(d.unit[0].offset(), d.verdicts[0].outcome, d.verdicts[0].attempts)
            for d in done] == [(1, Outcome.ACCEPT, 1), (0, Outcome.ACCEPT, 2)]
    first, again = [t for o, t in calls if o == 0]
    assert again - first >= 0.3 and [o for o, _ in calls] == [0, 1, 0]
    assert stats["retries"] == 1 and stats["retry_wait_ms"] >= 290
    inflight.close()


def test_a_retry_that_would_end_past_the_deadline_is_settled_as_its_release() -> None:
    stats: Counter[str] = Counter()

    async def fn(r: Record) -> Any:
        raise TimeoutError("busy")  # retry_on: a retry

    inflight = InFlight(fn, _config(), 2, stats, Pace(backoff=Backoff(initial_s=2.0)))
    inflight.begin(deadline=lambda: time.monotonic() + 0.5)  # 2 s of backoff does not fit
    inflight.start([Msg(0)])
    (done,) = _drive(inflight, 1)
    assert done.verdicts[0].outcome is Outcome.RELEASE and stats["retries"] == 0
    assert inflight.pending == 0
    inflight.close()


def test_retries_of_an_async_function_back_off_until_it_succeeds() -> None:
    stats: Counter[str] = Counter()
    tries: Counter[int] = Counter()

    async def fn(r: Record) -> Any:
        tries[r.offset] += 1
        if tries[r.offset] <= 2:
            raise TimeoutError("503")
        return b"ok"

    backoff = Backoff(initial_s=0.05, max_s=0.1, jitter=0.0)
    inflight = InFlight(fn, _config(), 4, stats, Pace(backoff=backoff))
    inflight.begin(deadline=lambda: time.monotonic() + 10)
    for i in range(4):
        inflight.start([Msg(i)])
    done = _drive(inflight, 4)
    assert sorted((d.unit[0].offset(), d.verdicts[0].outcome, d.verdicts[0].attempts)
                  for d in done) == [(i, Outcome.ACCEPT, 3) for i in range(4)]
    # Each record waited 50 then 100 ms (no jitter), counted per record.
    assert stats["retries"] == 8 and stats["retry_wait_ms"] >= 4 * 145
    inflight.close()


def test_the_rate_limit_spaces_the_calls_starts_without_blocking_the_worker() -> None:
    stats: Counter[str] = Counter()
    starts: list[float] = []
    lock = threading.Lock()

    def fn(r: Record) -> None:
        with lock:
            starts.append(time.monotonic())

    inflight = InFlight(fn, _config(), 8, stats, Pace(limiter=TokenBucket(20.0, burst=1)))
    inflight.begin(deadline=lambda: time.monotonic() + 10)
    t0 = time.monotonic()
    for i in range(8):
        inflight.start([Msg(i)])
    took_ms = (time.monotonic() - t0) * 1000
    assert took_ms < 200  # started at once: the tokens are awaited in the calls
    assert len(_drive(inflight, 8)) == 8
    starts.sort()
    # One token at once, then 20/s: the eighth call starts 7 / 20 s after the first.
    assert starts[-1] - starts[0] >= 0.35 - 0.02
    # The i-th start waited i / 20 s less the time the starts took (1 ms rounding each).
    assert stats["rate_limit_wait_ms"] >= sum(i * 50 for i in range(8)) - 8 * (took_ms + 1)
    inflight.close()


def test_a_unit_whose_token_comes_after_the_deadline_is_released_unprocessed() -> None:
    stats: Counter[str] = Counter()
    ran: list[int] = []

    def fn(r: Record) -> None:
        ran.append(r.offset)

    pace = Pace(limiter=TokenBucket(1.0, burst=1), attempts_allowed=5)
    inflight = InFlight(fn, _config(), 4, stats, pace)
    inflight.begin(deadline=lambda: time.monotonic() + 0.5)
    for m in (Msg(0), Msg(1), Msg(2, dc=5)):  # 2 is on its last delivery: on credit
        inflight.start([m])
    done = {d.unit[0].offset(): d.verdicts[0] for d in _drive(inflight, 3)}
    assert done[1].outcome is Outcome.RELEASE and done[1].unprocessed
    assert done[0].outcome is done[2].outcome is Outcome.ACCEPT and sorted(ran) == [0, 2]
    assert stats["released_rate_limit"] == 1
    inflight.close()


def test_a_retry_without_a_token_before_the_deadline_keeps_its_release() -> None:
    stats: Counter[str] = Counter()

    def fn(r: Record) -> Any:
        return Result.retry(after=0.05, error="busy")

    # One token a second: the first call takes the only one, the retry's would come too late.
    pace = Pace(limiter=TokenBucket(1.0, burst=1), backoff=Backoff())
    inflight = InFlight(fn, _config(), 2, stats, pace)
    inflight.begin(deadline=lambda: time.monotonic() + 0.6)
    inflight.start([Msg(0)])
    (done,) = _drive(inflight, 1)
    v = done.verdicts[0]
    assert (v.outcome, v.unprocessed, v.error, v.attempts) == (Outcome.RELEASE, False, "busy", 1)
    assert stats["released_rate_limit"] == stats["retries"] == 0  # the function had run
    inflight.close()


def test_a_unit_given_up_while_it_waits_for_its_token_is_never_called() -> None:
    stats: Counter[str] = Counter()
    ran: list[int] = []

    def fn(r: Record) -> None:
        ran.append(r.offset)

    inflight = InFlight(fn, _config(), 2, stats, Pace(limiter=TokenBucket(2.0, burst=1)))
    inflight.begin(deadline=lambda: time.monotonic() + 10)
    inflight.start([Msg(0)])
    inflight.start([Msg(1)])  # its token comes in 0.5 s
    assert [d.unit[0].offset() for d in _collect(inflight, 1)] == [0]
    assert [m.offset() for m in inflight.abandon()] == [1]
    end = time.monotonic() + _WAIT_S
    while stats["late_discarded"] < 1 and time.monotonic() < end:
        inflight.done(until=0)  # nothing runs: the late results only, without a wait
        time.sleep(0.02)
    assert stats["late_discarded"] == 1 and ran == [0]  # its thread came back without a call
    inflight.close()


def test_the_loop_paces_calls_in_flight_and_settles_each_record_once() -> None:
    tries: Counter[int] = Counter()

    async def fn(r: Record) -> Any:
        tries[r.offset] += 1
        if r.offset % 3 == 0 and tries[r.offset] == 1:
            raise TimeoutError("429")
        return b"o%d" % r.offset

    spec = _spec(concurrency=4, retry_backoff=Backoff(initial_s=0.05, max_s=0.05),
                 rate_limit=200.0, time_budget_s=3.0)
    c, p, s = _run(spec, fn, [[Msg(i) for i in range(12)], [Msg(i) for i in range(12, 20)]])
    assert c.acks == dict.fromkeys(range(20), "ACCEPT")
    assert sorted(v or b"" for t, v, _ in p.sent if t == "out") == \
        sorted(b"o%d" % i for i in range(20))
    assert s["retries"] == 7 and s["processed"] == 20 and s.get("released", 0) == 0


# ---- the options -----------------------------------------------------------------------------

@pytest.mark.parametrize(("kw", "match"), [
    ({"concurrency": 0}, "whole number >= 1"),
    ({"concurrency": 2.5}, "whole number >= 1"),
    ({"concurrency": 2001}, "a poll holds at most 2000"),
    ({"concurrency": 30, "batch_format": "pandas", "chunk_size": 100},
     "concurrency \\* chunk_size <= 2000"),
])
def test_bad_concurrency_names_the_option_and_the_fix(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(OptionError, match=match) as err:
        WorkerConfig.create(bootstrap_servers="unused:9092", group="g", topics="in", **kw)
    assert err.value.option == "concurrency"


def test_the_poll_asks_for_four_units_per_slot() -> None:
    assert _config(chunk_size=100).poll_records == 100  # concurrency 1: as before
    assert _config(chunk_size=1).poll_records == 1
    assert _config(chunk_size=100, concurrency=64).poll_records == 256
    assert _config(chunk_size=100, concurrency=8).poll_records == 100
    assert _config(chunk_size=50, concurrency=4, batch_format="arrow").poll_records == 800
    assert _config(chunk_size=100, concurrency=20, batch_format="arrow").poll_records == 2000


# ---- the worker loop with many calls in flight -----------------------------------------------

def _run(spec: WorkerSpec, fn: Callable[[Any], Any], polls: list[list[Msg]],
         producer: FakeProducer | None = None) -> tuple[FakeConsumer, FakeProducer,
                                                        dict[str, Any]]:
    consumer = FakeConsumer(polls)
    producer = producer or FakeProducer()
    summary = _Worker(spec, fn, session=ShareSession(consumer, timeout_s=1.0),
                      producer=producer).run()
    assert consumer.closed
    return consumer, producer, summary


def _spec(*, lock_ms: int = 30_000, **kw: Any) -> WorkerSpec:
    return WorkerSpec(_config(**kw), lock_ms=lock_ms, delivery_limit=5)


def test_each_record_once_with_its_output_and_dead_letter() -> None:
    def fn(r: Record) -> Any:
        return Result.reject("bad") if r.offset % 10 == 9 else b"o%d" % r.offset

    polls = [[Msg(i) for i in range(j, j + 20)] for j in range(0, 60, 20)]
    c, p, s = _run(_spec(concurrency=8), fn, polls)
    assert c.acks == {i: "REJECT" if i % 10 == 9 else "ACCEPT" for i in range(60)}
    outs = sorted(v or b"" for t, v, _ in p.sent if t == "out")
    assert outs == sorted(b"o%d" % i for i in range(60) if i % 10 != 9)
    assert sum(1 for t, _, _ in p.sent if t == "dlq") == 6
    assert (s["processed"], s["accepted"], s["dead_lettered"]) == (60, 54, 6)
    assert 0 < s["slot_ms"] <= s["slot_capacity_ms"]


def test_completed_records_are_settled_while_a_slow_one_runs() -> None:
    consumer = FakeConsumer([[Msg(i) for i in range(10)]])

    def fn(r: Record) -> bytes:
        if r.offset == 0:  # waits until the nine others were ACCEPTed
            end = time.monotonic() + _WAIT_S
            while len(consumer.acks) < 9 and time.monotonic() < end:
                time.sleep(0.01)
            return b"settled-before" if len(consumer.acks) == 9 else b"held-back"
        return b"fast"

    _Worker(_spec(concurrency=4), fn, session=ShareSession(consumer, timeout_s=1.0),
            producer=(producer := FakeProducer())).run()
    assert consumer.acks == dict.fromkeys(range(10), "ACCEPT")
    assert [v for t, v, _ in producer.sent][-1] == b"settled-before"


def test_an_async_function_with_concurrency_one() -> None:
    async def fn(r: Record) -> bytes:
        await asyncio.sleep(0)
        return b"a%d" % r.offset

    c, p, _ = _run(_spec(), fn, [[Msg(0), Msg(1), Msg(2)]])
    assert c.acks == dict.fromkeys(range(3), "ACCEPT")
    assert [v for _, v, _ in p.sent] == [b"a0", b"a1", b"a2"]  # one at a time: in order


def test_a_call_running_past_the_deadline_is_released_and_the_rest_go_on() -> None:
    release = threading.Event()

    def fn(r: Record) -> bytes:
        if r.offset == 0:
            release.wait(_WAIT_S)  # hangs past the lock deadline
            return b"late"
        return b"ok"

    # Deadline: 1 s after the poll (a 2 s lock, the default safety fraction 0.5).
    spec = _spec(lock_ms=2_000, concurrency=4, time_budget_s=3.0)
    try:
        c, p, s = _run(spec, fn, [[Msg(i) for i in range(6)], [Msg(6)]])
    finally:
        release.set()
    assert c.acks == {0: "RELEASE", **dict.fromkeys(range(1, 7), "ACCEPT")}
    assert b"late" not in [v for _, v, _ in p.sent]
    assert s["released_in_flight"] == 1 and s["processed"] == 6


def test_a_stop_releases_what_was_not_started_and_settles_what_runs() -> None:
    started: list[int] = []

    def fn(r: Record) -> None:
        started.append(r.offset)
        time.sleep(0.3)

    spec = _spec(time_budget_s=0.2, concurrency=2)
    c, _, s = _run(spec, fn, [[Msg(0), Msg(1), Msg(2), Msg(3, dc=5), Msg(4)]])
    # 0 and 1 ran when the budget ran out; 3 is on its last delivery: run anyway.
    assert c.acks == {0: "ACCEPT", 1: "ACCEPT", 2: "RELEASE", 3: "ACCEPT", 4: "RELEASE"}
    assert sorted(started) == [0, 1, 3]
    assert s["released_on_stop"] == 2 and s["stop_reason"] == "time budget"


def test_a_mistake_in_flight_releases_every_record_held() -> None:
    def fn(r: Record) -> Any:
        return 42 if r.offset == 3 else None

    c, _, s = _run(_spec(concurrency=4, output_topic=None),
                   fn, [[Msg(i) for i in range(8)], [Msg(8)]])
    assert 3 in c.acks and c.acks[3] == "RELEASE" and 8 not in c.acks
    assert set(c.acks) == set(range(8)) and s["failure"]["option"] == "fn"
    assert s["stop_reason"] == "configuration mistake (fn)"


def test_an_interrupt_in_a_thread_releases_every_unacknowledged_record() -> None:
    def fn(r: Record) -> None:
        if r.offset == 2:
            raise KeyboardInterrupt

    consumer = FakeConsumer([[Msg(0), Msg(1), Msg(2), Msg(3)]])
    with pytest.raises(KeyboardInterrupt):
        _Worker(_spec(concurrency=2, chunk_size=1), fn,
                session=ShareSession(consumer, timeout_s=1.0), producer=FakeProducer()).run()
    assert consumer.acks[2] == "RELEASE" and set(consumer.acks) == {0, 1, 2, 3}
    assert consumer.closed


def test_the_summary_says_how_full_the_slots_stayed() -> None:
    totals = _totals([{"slot_ms": 300, "slot_capacity_ms": 400, "released_in_flight": 2,
                       "late_discarded": 1}, {"slot_ms": 150, "slot_capacity_ms": 200}])
    summary = WorkerSummary(elapsed_s=1.0, stop_reason="idle timeout", totals=totals)
    assert summary.slots_filled == 0.75
    assert "concurrency: slots filled 75% (mean calls in flight / concurrency" in str(summary)
    assert "released while running=2 late results discarded=1" in str(summary)
    plain = WorkerSummary(elapsed_s=1.0, stop_reason="idle timeout", totals=_totals([{}]))
    assert "concurrency" not in str(plain) and plain.slots_filled == 0.0


def test_the_docs_http_example_is_python_that_uses_concurrency() -> None:
    """docs/workers.md's runnable example compiles and uses the option (it is run as written
    by tests/integration/test_workers_concurrency.py)."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "workers.md").read_text()
    section = text.split("### Worked example: enrich records with an HTTP service")[1]
    code = section.split("```python\n")[1].split("```")[0]
    compile(code, "docs/workers.md", "exec")
    assert "async def enrich" in code and "concurrency=64" in code
