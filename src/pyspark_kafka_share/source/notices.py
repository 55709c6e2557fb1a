"""The source's run-time notices: what Spark or a producer does that a user would not expect,
logged once per query run as a WARNING, with the fix. Pure functions of what the driver
knows, so each is tested without Spark; the reader (``datasource``) logs them."""

from __future__ import annotations

from collections.abc import Mapping

from pyspark_kafka_share._spark import ADMISSION_CONTROL, spark_version
from pyspark_kafka_share.source.options import DEFAULT_BATCH_DURATION_MS, SourceOptions

__all__ = ["OVERSIZE_FACTOR", "available_now_notice", "oversized_batch_notice"]

OVERSIZE_FACTOR = 2
"""A batch with more than this many times ``maxRecordsPerTrigger`` records is named."""


def available_now_notice(options: SourceOptions, lag: int | None,
                         admission_control: bool = ADMISSION_CONTROL,
                         version: str | None = None) -> tuple[str, str] | None:
    """At a query run's first trigger on Spark < 4.2, with records waiting: what
    ``Trigger.AvailableNow`` does there. Spark gives Python sources no AvailableNow before
    4.2 and does not tell them the trigger, so the source says it to every run that has a
    backlog at start; None on 4.2+ or with nothing waiting."""
    if admission_control or not lag:
        return None
    cap = options.max_batch_duration_ms or DEFAULT_BATCH_DURATION_MS
    bounds = f"maxBatchDurationMs ({cap} ms)"
    if options.max_records_per_trigger:
        bounds += f" and maxRecordsPerTrigger ({options.max_records_per_trigger})"
    return "available-now", (
        f"share group {options.group_id!r} has {lag} records waiting at this query's start. "
        f"PySpark {version or spark_version()} has no Trigger.AvailableNow for Python sources "
        "(it arrived in 4.2): a query started with Trigger.AvailableNow or Once runs ONE "
        f"micro-batch, bounded by {bounds}, and leaves what it did not read for the next "
        "run. To drain the group in one run, upgrade to PySpark 4.2 or newer, or use a "
        "processing-time trigger and stop the query once pyspark_kafka_share.progress(query)"
        ".lag == 0 (docs/operations.md). Under a processing-time trigger, nothing to do")


def oversized_batch_notice(options: SourceOptions,
                           batch: Mapping[str, int]) -> tuple[str, str] | None:
    """When a finished batch emitted more than ``OVERSIZE_FACTOR`` times
    ``maxRecordsPerTrigger``: the broker hands out whole producer batches, so the producer's
    batching sets how far the cap can be overshot."""
    cap = options.max_records_per_trigger
    records = batch.get("records", 0)
    if not cap or records <= OVERSIZE_FACTOR * cap:
        return None
    return "oversized-batch", (
        f"batch {batch.get('batch')} of share group {options.group_id!r} read {records} "
        f"records, {records / cap:.1f}x maxRecordsPerTrigger={cap}: the broker hands a "
        "share consumer whole producer batches, so one poll can hold thousands of records "
        "whatever the cap. The cause is the producers' batch size (linger.ms, batch.size); "
        "produce smaller batches (e.g. linger.ms=0) for a tighter cap, or raise "
        "maxRecordsPerTrigger to what a batch really holds (docs/options.md). Logged once "
        "per query run")
