"""What both front-ends ask of Spark on the executors (no Kafka here)."""

from __future__ import annotations

import uuid
from typing import Any

__all__ = ["attempt_identity", "query_id", "task_context"]


def task_context() -> Any:
    """Spark's ``TaskContext`` of the running task, or None outside a Spark task."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover
        return None
    return TaskContext.get()


def query_id() -> str | None:
    """Spark's id of the running streaming query (stable across restarts), if any."""
    ctx = task_context()
    return None if ctx is None else ctx.getLocalProperty("sql.streaming.queryId")


def attempt_identity() -> tuple[int, int, int]:
    """(partition id, taskAttemptId, attemptNumber) from Spark; random outside Spark."""
    ctx = task_context()
    if ctx is None:
        return 0, uuid.uuid4().int & 0x7FFF_FFFF_FFFF, 0
    return int(ctx.partitionId()), int(ctx.taskAttemptId()), int(ctx.attemptNumber())
