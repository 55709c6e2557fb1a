"""What user code returns for a record, and what it is given: the queue workers' vocabulary.

:class:`Outcome` (ACCEPT, RELEASE, REJECT), :class:`Result` (an outcome with an output record or
error text) and :class:`Record` (one delivered record, as a per-record function receives it);
:data:`WorkerFunction`, the type of the function ``run_workers`` runs. Exported by
:mod:`pyspark_kafka_share.workers`; the executor loop (``loop``) acts on them.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Outcome", "Record", "RecordFunction", "Result", "UserResult", "WorkerFunction"]


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

    @staticmethod
    def accept(value: bytes | str | None = None, key: bytes | str | None = None) -> Result:
        return Result(Outcome.ACCEPT, value, key)

    @staticmethod
    def release(error: str | None = None) -> Result:
        return Result(Outcome.RELEASE, error=error)

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


UserResult = Result | Outcome | bytes | str | None

"""What a per-record function may return: ``None`` (ACCEPT), an output value (ACCEPT with an
output record), an :class:`Outcome` or a :class:`Result`."""

RecordFunction = Callable[[Record], UserResult]
"""``batch_format="record"``: a function of one :class:`Record`."""

WorkerFunction = RecordFunction | Callable[[Any], object]
"""The function ``run_workers`` runs: of one :class:`Record`, or of one batch (a
``pyarrow.Table`` or a ``pandas.DataFrame``, by ``batch_format``) returning ``None`` or one
:data:`UserResult` per row."""
