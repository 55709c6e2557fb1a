"""A record's verdict: what the user's function decided for it, as the settlers act on it.

:func:`call` runs the function on a chunk (per record, or per batch; :func:`call_async` awaits
an ``async def`` one) and turns every result into a :class:`Verdict` (:func:`normalise`, then
:func:`checked`); a function's exception is the record's (REJECT, or RELEASE for ``retry_on``,
:func:`raised`), never a crash of the worker; a result the job's configuration cannot honour
is the job's mistake, not the record's: :func:`checked` and :func:`invalid` raise
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
from pyspark_kafka_share.workers.outcome import Outcome, Record, Result, UserResult

__all__ = ["Final", "Verdict", "batch_input", "batch_verdicts", "call", "call_async", "checked",
           "failed", "invalid", "normalise", "raised", "resolve"]


@dataclass
class Verdict:
    outcome: Outcome
    value: bytes | None = None
    key: bytes | None = None
    error: str | None = None
    error_type: str | None = None


Final = tuple[Any, Outcome, Verdict]
"""A processed record: (message, outcome resolved, verdict)."""


def _to_bytes(v: bytes | str | None) -> bytes | None:
    return v.encode() if isinstance(v, str) else v


def _record(m: Any) -> Record:
    ts_type, ts = m.timestamp()
    stamp = dt.datetime.fromtimestamp(ts / 1000, dt.timezone.utc) if ts_type else None
    return Record(m.key(), m.value(), m.topic(), m.partition(), m.offset(), stamp,
                  tuple(m.headers() or ()), m.delivery_count())


def normalise(r: UserResult) -> Verdict:
    if r is None:
        return Verdict(Outcome.ACCEPT)
    if isinstance(r, Outcome):
        return Verdict(r)
    if isinstance(r, bytes | str):
        return Verdict(Outcome.ACCEPT, _to_bytes(r))
    if isinstance(r, Result):
        return Verdict(r.outcome, _to_bytes(r.value), _to_bytes(r.key), r.error)
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


def call(fn: Callable[[Any], Any], chunk: list[Any], config: WorkerConfig) -> list[Verdict]:
    """The function's verdict per record; its mistakes are the records' poison."""
    if config.batch_format == "record":
        return [_call_one(fn, m, config) for m in chunk]
    return _call_batch(fn, chunk, config)


async def call_async(fn: Callable[[Any], Awaitable[Any]], chunk: list[Any],
                     config: WorkerConfig) -> list[Verdict]:
    """:func:`call` of an ``async def`` function (awaited; per record, one after the other)."""
    if config.batch_format == "record":
        out = []
        for m in chunk:
            try:
                result = await fn(_record(m))
            except Exception as exc:  # noqa: BLE001 - the user's failure is the record's
                out.append(raised(exc, config))
                continue
            out.append(checked(result, config))
        return out
    batch = batch_input(chunk, config)
    try:
        results = await fn(batch)
    except Exception as exc:  # noqa: BLE001 - the user's failure is the records'
        return [raised(exc, config) for _ in chunk]
    return batch_verdicts(results, len(chunk), config)


def _call_one(fn: Callable[[Any], Any], m: Any, config: WorkerConfig) -> Verdict:
    try:
        result = fn(_record(m))
    except Exception as exc:  # noqa: BLE001 - the user's failure is the record's
        return raised(exc, config)
    return checked(result, config)


def _call_batch(fn: Callable[[Any], Any], chunk: list[Any],
                config: WorkerConfig) -> list[Verdict]:
    batch = batch_input(chunk, config)
    try:
        results = fn(batch)
    except Exception as exc:  # noqa: BLE001 - the user's failure is the records'
        return [raised(exc, config) for _ in chunk]
    return batch_verdicts(results, len(chunk), config)


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


def raised(exc: Exception, config: WorkerConfig) -> Verdict:
    """The verdict of a function that raised ``exc``: RELEASE for ``retry_on``, else REJECT."""
    return failed(Outcome.RELEASE if isinstance(exc, config.retry_on) else Outcome.REJECT, exc)


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
