"""The ``kafka-share`` source's lag and last-batch counters from a streaming query's progress,
the same on every Spark line.

Python sources report through the offsets Spark puts in ``StreamingQueryProgress``, and the
lines differ in where and how: Spark 4.2+ shows the source's report as ``latestOffset`` (JSON);
4.0 and 4.1 have no such call, so the report rides in the offset Spark logs (``endOffset``),
which ``StreamingQueryProgress`` of PySpark 4.1 renders as a Python repr (single quotes) and
4.1 leaves ``latestOffset`` ``None``. :func:`progress` reads all of them::

    import pyspark_kafka_share as ks
    p = ks.progress(query)          # None before the query's first progress
    p.lag                           # records of the group not yet acknowledged for good
    p.last_batch["records"]         # counters of the source's last finished batch
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SourceProgress", "progress"]


@dataclass(frozen=True)
class SourceProgress:
    """One progress report of a query's ``kafka-share`` source (docs/operations.md).

    ``batch_id``: Spark's micro-batch id of the report; ``input_rows``: rows that micro-batch
    read (0 for a trigger that planned none); ``lag``: the group's records not yet
    acknowledged for good when the source last looked (None: unknown); ``lag_by_partition``:
    ``{"topic:partition": lag}``; ``last_batch``: the counters of the source's last finished
    batch, summed over its tasks (``records``, ``accepted``, ``released``,
    ``duplicates_dropped``, ...; empty before the first one, or without ``journalPath``);
    ``timestamp``: the progress's time (ISO 8601, as Spark gives it).

    A report is made when a trigger starts: once a query has stopped, its last report holds
    the lag from before its last batch (after an AvailableNow run on Spark 4.0/4.1, the lag
    the run started with). Read the group's lag then with
    :meth:`~pyspark_kafka_share.admin.ShareGroupAdmin.total_lag` (docs/operations.md).
    """

    batch_id: int
    input_rows: int
    lag: int | None
    lag_by_partition: dict[str, int | None] = field(default_factory=dict)
    last_batch: dict[str, int] = field(default_factory=dict)
    timestamp: str = ""


def _parsed(value: Any) -> dict[str, Any] | None:
    """An offset as a dict: JSON text, a Python repr (PySpark 4.0/4.1), or already a dict."""
    if isinstance(value, Mapping):
        return dict(value)
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        found = json.loads(value)
    except ValueError:
        try:
            found = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            return None
    return found if isinstance(found, dict) else None


def _report(source: Mapping[str, Any]) -> dict[str, Any] | None:
    """The source's report: ``latestOffset`` where it carries one (Spark 4.2+), else the
    ``endOffset`` Spark logged (4.0, 4.1). None when neither is a kafka-share report."""
    for key in ("latestOffset", "endOffset"):
        found = _parsed(source.get(key))
        if found is not None and "lastBatch" in found:
            return found
    return None


def _as_dict(last: Any) -> dict[str, Any]:
    """A ``StreamingQueryProgress`` (or its ``json``, or a dict) as a plain dict."""
    if isinstance(last, Mapping):
        return dict(last)
    text = last if isinstance(last, str) else getattr(last, "json", None)
    if isinstance(text, str):
        parsed = json.loads(text)
        return parsed if isinstance(parsed, dict) else {}
    raise TypeError(f"not a streaming query or progress: {last!r}")


def progress(query_or_progress: Any) -> SourceProgress | None:
    """The ``kafka-share`` source's report in a query's last progress.

    Takes a ``StreamingQuery`` of a classic or a Spark Connect session (reads
    ``lastProgress``; no SparkContext needed), or one ``StreamingQueryProgress``
    (e.g. from ``query.recentProgress`` or a listener's ``event.progress``), its JSON text or
    its dict. None when there is no progress yet or no ``kafka-share`` source reported in it
    (a trigger before the source's first offset). With several ``kafka-share`` sources, the
    first one's.
    """
    last = query_or_progress
    if hasattr(last, "lastProgress") and hasattr(last, "recentProgress"):
        last = last.lastProgress
    if last is None:
        return None
    data = _as_dict(last)
    for source in data.get("sources") or ():
        report = _report(source)
        if report is None:
            continue
        lag = report.get("lag")
        return SourceProgress(
            batch_id=int(data.get("batchId", -1)),
            input_rows=int(source.get("numInputRows") or 0),
            lag=None if lag is None else int(lag),
            lag_by_partition=dict(report.get("lagByPartition") or {}),
            last_batch={str(k): int(v) for k, v in (report.get("lastBatch") or {}).items()},
            timestamp=str(data.get("timestamp", "")),
        )
    return None
