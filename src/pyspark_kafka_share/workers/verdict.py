"""A record's verdict: what the user's function decided for it, as the settlers act on it.

:func:`call` runs the function on a chunk (per record, or per batch; :func:`call_async` awaits
an ``async def`` one, for the calls in flight of ``concurrency``) and turns every result
into a :class:`Verdict` (:func:`normalise`, then :func:`checked`); a function's exception is the
record's (:func:`recovered`: the job's ``recoverer``, by default REJECT, or a retry for
``retry_on``), never a crash of the worker; a record its deserializer cannot decode is poison
(``decode.py``). Retries wait as the chunk's pace allows (``retry.py``: the backoff, the rate
limit, the lock's deadline). A result the job's configuration cannot honour, or a recoverer
that raises, is the job's mistake, not the record's: :func:`checked` and :func:`invalid` raise
:class:`~pyspark_kafka_share.workers.mistakes.JobMistake` (issue 35).
:func:`resolve` turns a RELEASE on the record's last allowed attempt into poison.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import pyarrow as pa

from pyspark_kafka_share._kafka.arrow import messages_to_batch
from pyspark_kafka_share.workers import mistakes
from pyspark_kafka_share.workers.config import WorkerConfig
from pyspark_kafka_share.workers.decode import DecodeError, decode, transient
from pyspark_kafka_share.workers.outcome import Outcome, Record, Result, UserResult
from pyspark_kafka_share.workers.retry import Pace

__all__ = ["MAX_ATTEMPTS_IN_PLACE", "Final", "Verdict", "batch_input", "batch_verdicts", "call",
           "call_async", "checked", "failed", "invalid", "normalise", "recovered", "resolve"]


@dataclass
class Verdict:
    outcome: Outcome
    value: bytes | None = None
    key: bytes | None = None
    error: str | None = None
    error_type: str | None = None
    retry: bool = False
    """A RELEASE the worker may retry in place (``retry_on``, a recoverer's RELEASE,
    ``Result.retry``), waited by the pace (:class:`~pyspark_kafka_share.workers.retry.Pace`)."""
    after_s: float | None = None
    """The wait the function named (``Result.retry(after=...)``)."""
    attempts: int = 1
    """Calls of the function on the record in this delivery."""
    unprocessed: bool = False
    """RELEASEd by the rate limit before the function ran."""
    undecodable: bool = False
    """Poison because its deserializer failed (counted by the worker as ``undecodable``)."""


Final = tuple[Any, Outcome, Verdict]
"""A processed record: (message, outcome resolved, verdict)."""

MAX_ATTEMPTS_IN_PLACE = 100
"""Calls of the function on one record in one delivery at most: a guard against a busy loop
(``Result.retry(after=0)`` on every call); the lock's deadline ends the retries sooner."""


def _to_bytes(v: bytes | str | None) -> bytes | None:
    return v.encode() if isinstance(v, str) else v


def _record(m: Any, decoded: tuple[Any, Any] = (None, None)) -> Record:
    ts_type, ts = m.timestamp()
    stamp = dt.datetime.fromtimestamp(ts / 1000, dt.timezone.utc) if ts_type else None
    return Record(m.key(), m.value(), m.topic(), m.partition(), m.offset(), stamp,
                  tuple(m.headers() or ()), m.delivery_count(), *decoded)


def normalise(r: UserResult) -> Verdict:
    if r is None:
        return Verdict(Outcome.ACCEPT)
    if isinstance(r, Outcome):
        return Verdict(r)
    if isinstance(r, bytes | str):
        return Verdict(Outcome.ACCEPT, _to_bytes(r))
    if isinstance(r, Result):
        return Verdict(r.outcome, _to_bytes(r.value), _to_bytes(r.key), r.error,
                       retry=r.wants_retry and r.outcome is Outcome.RELEASE,
                       after_s=r.retry_after_s)
    raise TypeError(f"a worker function returned {type(r).__name__} for a record; return None, "
                    "bytes/str (an output value), an Outcome or a Result")


def checked(result: Any, config: WorkerConfig) -> Verdict:
    """A result as a verdict; a result the configuration cannot honour stops the job
    (:class:`mistakes.JobMistake`): it is not the record's poison."""
    try:
        v = normalise(result)
    except TypeError as exc:
        invalid(str(exc))
    if v.value is not None and v.outcome is Outcome.ACCEPT and config.output_topic is None:
        raise mistakes.no_output_topic()
    return v


def recovered(exc: Exception, record: Record, config: WorkerConfig) -> Verdict:
    """The verdict of the function's exception ``exc`` on ``record``: the job's ``recoverer``
    decides, or by default ``retry_on`` (a retry) and any other (poison). A recoverer that
    raises, or returns what no record can carry, is the job's mistake (never the record's)."""
    if config.recoverer is None:
        if isinstance(exc, config.retry_on):
            return dataclasses.replace(failed(Outcome.RELEASE, exc), retry=True)
        return failed(Outcome.REJECT, exc)
    try:
        result = config.recoverer(exc, record)
    except Exception as bad:  # the recoverer's failure is the job's
        raise mistakes.recoverer_failed(bad, exc) from bad
    v = checked(result, config)
    if v.outcome is Outcome.RELEASE:
        v.retry = True
    if v.outcome is not Outcome.ACCEPT:
        v.error = v.error or failed(v.outcome, exc).error
        v.error_type = type(exc).__qualname__
    return v


def call(fn: Callable[[Any], Any], chunk: list[Any], config: WorkerConfig,
         pace: Pace | None = None) -> list[Verdict]:
    """The function's verdict per record; its exceptions are the records' (:func:`recovered`).

    ``pace``: the deadline by which the chunk must be decided, the retry policy and the rate
    limit (:mod:`~pyspark_kafka_share.workers.retry`); records that ask for a retry are
    called again after their wait while the deadline allows (:func:`_retry_in_place`). No
    pace (or no deadline): every RELEASE is returned at once, as without a retry policy."""
    pace = pace if pace is not None else Pace()
    t0 = pace.clock()
    if config.batch_format == "record":
        verdicts = [_attempt(fn, m, config, pace) for m in chunk]
    else:
        verdicts = _call_batch(fn, chunk, config, pace)
    limited = pace.counts["rate_limit_wait_ms"] / 1000
    per_record_s = max(0.0, pace.clock() - t0 - limited) / max(1, len(chunk))
    if pace.deadline is not None:
        _retry_in_place(fn, chunk, verdicts, config, pace, per_record_s=per_record_s)
    pace.counts["released_rate_limit"] += sum(1 for v in verdicts if v.unprocessed)
    return verdicts


def _attempt(fn: Callable[[Any], Any], m: Any, config: WorkerConfig, pace: Pace) -> Verdict:
    """One call of a per-record function: decoded, within the rate limit, recovered."""
    record = _decoded(m, config)
    if isinstance(record, Verdict):
        return record
    if not pace.tokens(1, last_delivery=m.delivery_count() >= pace.attempts_allowed):
        return Verdict(Outcome.RELEASE, unprocessed=True)
    try:
        result = fn(record)
    except Exception as exc:  # noqa: BLE001 - the user's failure is the record's
        return recovered(exc, record, config)
    return checked(result, config)


def _decoded(m: Any, config: WorkerConfig) -> Record | Verdict:
    """``m`` as the function's :class:`Record`, its key and value decoded; or, when its
    deserializer failed, its verdict: poison with the decoder's error, or a retry when the
    registry rather than the record failed (:func:`transient`)."""
    try:
        return _record(m, decode(m, config.key_deserializer, config.value_deserializer))
    except DecodeError as exc:
        error, error_type = str(exc)[:2000], type(exc.cause).__qualname__
        if transient(exc):
            return Verdict(Outcome.RELEASE, error=error, error_type=error_type, retry=True)
        return Verdict(Outcome.REJECT, error=error, error_type=error_type, undecodable=True)


def _call_batch(fn: Callable[[Any], Any], chunk: list[Any], config: WorkerConfig,
                pace: Pace) -> list[Verdict]:
    last = any(m.delivery_count() >= pace.attempts_allowed for m in chunk)
    if not pace.tokens(len(chunk), last_delivery=last):
        return [Verdict(Outcome.RELEASE, unprocessed=True) for _ in chunk]
    try:
        results = fn(batch_input(chunk, config))
    except Exception as exc:  # noqa: BLE001 - the user's failure is the records'
        return [recovered(exc, _record(m), config) for m in chunk]
    return batch_verdicts(results, len(chunk), config)


async def call_async(fn: Callable[[Any], Awaitable[Any]], chunk: list[Any],
                     config: WorkerConfig) -> list[Verdict]:
    """:func:`call` of an ``async def`` function (awaited; per record, one after the other):
    decoded and recovered alike; its retries and rate limit are the calls in flight's
    (``inflight.InFlight``: a retry waits without a slot, tokens gate each call's start)."""
    if config.batch_format != "record":
        batch = batch_input(chunk, config)
        try:
            results = await fn(batch)
        except Exception as exc:  # noqa: BLE001 - the user's failure is the records'
            return [recovered(exc, _record(m), config) for m in chunk]
        return batch_verdicts(results, len(chunk), config)
    out = []
    for m in chunk:
        record = _decoded(m, config)
        if isinstance(record, Verdict):
            out.append(record)
            continue
        try:
            result = await fn(record)
        except Exception as exc:  # noqa: BLE001 - the user's failure is the record's
            out.append(recovered(exc, record, config))
            continue
        out.append(checked(result, config))
    return out


def batch_input(chunk: list[Any], config: WorkerConfig) -> Any:
    """What a batch function is given for ``chunk``: a ``pyarrow.Table`` or a DataFrame."""
    table: Any = pa.Table.from_batches([messages_to_batch(chunk, include_headers=True)])
    return table.to_pandas() if config.batch_format == "pandas" else table


def batch_verdicts(results: Any, n: int, config: WorkerConfig) -> list[Verdict]:
    """A batch function's ``results`` for ``n`` rows as one verdict per row."""
    rows = _result_rows(results, n)
    if isinstance(rows, Verdict):  # one verdict for all: a copy per record
        return [dataclasses.replace(rows) for _ in range(n)]
    return [checked(r, config) for r in rows]


def _retry_in_place(fn: Callable[[Any], Any], chunk: list[Any], verdicts: list[Verdict],
                    config: WorkerConfig, pace: Pace, *, per_record_s: float) -> None:
    """Call the function again on the records that asked for a retry, each after its wait,
    while the call would end before the pace's deadline; what is left stays a RELEASE.
    A record's waits overlap the others': the worker sleeps until the earliest is due, then
    retries every record due (a batch function: on a table of those rows)."""
    failed_at = dict.fromkeys(range(len(chunk)), pace.clock())
    while True:
        now = pace.clock()
        due: dict[int, float] = {}
        for i, v in enumerate(verdicts):
            if not v.retry or v.outcome is not Outcome.RELEASE or \
                    v.attempts >= MAX_ATTEMPTS_IN_PLACE:
                continue
            wait = pace.wait_for(chunk[i].delivery_count() - 1 + v.attempts - 1, v.after_s)
            if wait is not None and pace.fits(max(now, failed_at[i] + wait), per_record_s):
                due[i] = failed_at[i] + wait
        if not due:
            return
        first = min(due.values())
        pace.pause(first - now)
        # The earliest is due whatever the clock says (a sleep may end a hair early).
        now = max(pace.clock(), first)
        ready = [i for i, at in sorted(due.items(), key=lambda kv: kv[1]) if at <= now]
        again = _again(fn, chunk, ready, config, pace, per_record_s=per_record_s)
        if all(new is None for new in again):
            return  # the deadline (or the rate limit) leaves no time for them
        for i, new in zip(ready, again, strict=True):
            if new is not None:
                new.attempts = verdicts[i].attempts + 1
                verdicts[i] = new
                failed_at[i] = pace.clock()
                pace.counts["retries"] += 1


def _again(fn: Callable[[Any], Any], chunk: list[Any], ready: list[int], config: WorkerConfig,
           pace: Pace, *, per_record_s: float) -> list[Verdict | None]:
    """The new verdicts of the records ``ready`` (None: not called, the deadline is near or
    the rate limit has no token before it: the record keeps its RELEASE)."""
    out: list[Verdict | None]
    if config.batch_format != "record":
        if not pace.fits(pace.clock(), per_record_s * len(ready)):
            return [None] * len(ready)
        out = list(_call_batch(fn, [chunk[i] for i in ready], config, pace))
    else:
        out = [_attempt(fn, chunk[i], config, pace)
               if pace.fits(pace.clock(), per_record_s) else None for i in ready]
    return [None if v is None or v.unprocessed else v for v in out]


def _result_rows(results: Any, n: int) -> list[Any] | Verdict:
    """A batch function's results as one per row, or (None) the ACCEPT of all ``n`` rows;
    results that cannot be read that way are the job's mistake (:func:`invalid`)."""
    if results is None:
        return Verdict(Outcome.ACCEPT)
    try:
        if isinstance(results, pa.Array | pa.ChunkedArray):
            results = results.to_pylist()
        elif hasattr(results, "tolist"):  # pandas Series, numpy array
            results = results.tolist()
        rows = list(results)
    except TypeError as exc:
        invalid(f"the batch function returned {type(results).__name__}: {exc}")
    if len(rows) != n:
        invalid(f"the batch function returned {len(rows)} results for {n} rows; "
                "return one per row, in order, or None")
    return rows


def invalid(why: str) -> NoReturn:
    """A result no record can carry (``why``): the job's mistake, raised."""
    raise mistakes.wrong_result(why)


def failed(outcome: Outcome, exc: BaseException) -> Verdict:
    return Verdict(outcome, error=f"{type(exc).__name__}: {exc}"[:2000],
                   error_type=type(exc).__qualname__)


def resolve(m: Any, v: Verdict, attempts_allowed: int, stats: Counter[str]) -> Outcome:
    """A RELEASE on the record's last allowed attempt becomes poison."""
    if v.outcome is Outcome.RELEASE and m.delivery_count() >= attempts_allowed:
        v.error = f"gave up after {m.delivery_count()} attempts: {v.error or 'released'}"
        stats["exhausted"] += 1
        return Outcome.REJECT
    return v.outcome
