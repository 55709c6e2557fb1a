"""What user code returns for a record, and what it is given: the queue workers' vocabulary.

:class:`Outcome` (ACCEPT, RELEASE, REJECT), :class:`Result` (an outcome with an output record or
error text, or a retry with its wait) and :class:`Record` (one delivered record, as a
per-record function receives it); :data:`WorkerFunction`, the type of the function
``run_workers`` runs, and :data:`Recoverer`, of the one that maps its exceptions to
outcomes. Exported by :mod:`pyspark_kafka_share.workers`; the executor loop (``loop``) acts on
them.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Outcome", "Record", "RecordFunction", "Recoverer", "Result", "UserResult",
           "WorkerFunction"]


class Outcome(enum.Enum):
    """What happens to a record at the broker."""

    ACCEPT = "accept"
    """Done: never delivered again."""
    RELEASE = "release"
    """Retry: the broker redelivers it (to any worker) with ``delivery_count + 1``."""
    REJECT = "reject"
    """Poison: written to the dead-letter topic if one is set, then never delivered again."""


@dataclass(frozen=True)
class Result:
    """A record's outcome, with an optional output record (ACCEPT) or error text."""

    outcome: Outcome = Outcome.ACCEPT
    value: bytes | str | None = None
    """Produced to ``output_topic`` before the record is ACCEPTed (ACCEPT only)."""
    key: bytes | str | None = None
    """Key of the output record; default: the input record's key."""
    error: str | None = None
    """Why (RELEASE/REJECT): goes into the dead-letter record's headers."""
    wants_retry: bool = False
    """RELEASE as a retry (:meth:`retry`): the worker may call the function again in place."""
    retry_after_s: float | None = None
    """With :attr:`wants_retry`: the wait before that call (None: ``retry_backoff``'s)."""

    @staticmethod
    def accept(value: bytes | str | None = None, key: bytes | str | None = None) -> Result:
        return Result(Outcome.ACCEPT, value, key)

    @staticmethod
    def release(error: str | None = None) -> Result:
        return Result(Outcome.RELEASE, error=error)

    @staticmethod
    def retry(after: float | None = None, error: str | None = None) -> Result:
        """Try again: after ``after`` seconds (a ``Retry-After``; None: the job's
        ``retry_backoff``, or at once without one), in this worker while the record's lock
        allows, else RELEASEd (redelivered at once). Counts as a failed attempt: on the
        record's last allowed delivery it becomes poison, as a RELEASE does."""
        return Result(Outcome.RELEASE, error=error, wants_retry=True, retry_after_s=after)

    @staticmethod
    def reject(error: str | None = None) -> Result:
        return Result(Outcome.REJECT, error=error)


@dataclass(frozen=True)
class Record:
    """One delivered record, as the per-record function receives it."""

    key: bytes | None
    value: bytes | None
    topic: str
    partition: int
    offset: int
    timestamp: dt.datetime | None
    headers: tuple[tuple[str, bytes | None], ...]
    delivery_count: int
    """1 on the first delivery; the attempt number."""
    decoded_key: Any = None
    """What ``key_deserializer`` made of :attr:`key` (None without one)."""
    decoded_value: Any = None
    """What ``value_deserializer`` made of :attr:`value` (None without one)."""


UserResult = Result | Outcome | bytes | str | None

"""What a per-record function may return: ``None`` (ACCEPT), an output value (ACCEPT with an
output record), an :class:`Outcome` or a :class:`Result`."""

RecordFunction = Callable[[Record], UserResult]
"""``batch_format="record"``: a function of one :class:`Record`."""

Recoverer = Callable[[Exception, Record], UserResult]
"""``run_workers(recoverer=...)``: what an exception of the function means for the record it
was called on: an :class:`Outcome` or a :class:`Result` (a RELEASE is a retry, waited by
``retry_backoff``; ``Result.retry(after=...)`` names the wait)."""

WorkerFunction = RecordFunction | Callable[[Any], object]
"""The function ``run_workers`` runs: of one :class:`Record`, or of one batch (a
``pyarrow.Table`` or a ``pandas.DataFrame``, by ``batch_format``) returning ``None`` or one
:data:`UserResult` per row."""
