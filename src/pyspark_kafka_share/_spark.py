"""What both front-ends ask of Spark (no Kafka here): the running task on the executors; on
the driver, which Spark APIs this PySpark has and which Python Spark starts."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import uuid
from typing import Any

from pyspark_kafka_share.errors import SetupError

__all__ = [
    "ADMISSION_CONTROL",
    "attempt_identity",
    "check_spark_python",
    "query_id",
    "require_pandas",
    "spark_version",
    "task_context",
]

ADMISSION_CONTROL: bool = importlib.util.find_spec("pyspark") is not None and \
    importlib.util.find_spec("pyspark.sql.streaming.datasource") is not None
"""Spark >= 4.2: ``latestOffset(start, limit)``, ``ReadLimit``, ``Trigger.AvailableNow`` and
``reportLatestOffset`` for Python streaming sources (docs/options.md, "Spark versions")."""

WORKER_MODULES = ("pyspark_kafka_share", "pyarrow", "pandas")
_PROBE = ("import importlib.util, sys; "
          "print(','.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")


def spark_version() -> str:
    """This PySpark's version ("" without PySpark)."""
    try:
        from pyspark import __version__
    except ImportError:  # pragma: no cover
        return ""
    return str(__version__)


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


def require_pandas() -> None:
    """The queue workers hand batches to Spark's ``mapInArrow``, which needs pandas and
    pyarrow in the versions this PySpark supports: checked here, before any task starts."""
    from pyspark.sql.pandas.utils import (
        require_minimum_pandas_version,
        require_minimum_pyarrow_version,
    )

    try:
        require_minimum_pandas_version()
        require_minimum_pyarrow_version()
    except ImportError as exc:
        raise SetupError(
            f"{exc} (this Python: {sys.executable}). Install the package's dependencies: "
            f"{sys.executable} -m pip install 'pyspark-kafka-share' (pandas>=2.2,<3)") from None


@functools.cache
def _missing(python: str, modules: tuple[str, ...]) -> str:
    """The modules ``python`` cannot import, comma-separated ('' when none)."""
    found = shutil.which(python)
    if found is None:
        return f"(no such program {python!r})"
    if os.path.realpath(found) == os.path.realpath(sys.executable):
        return ",".join(m for m in modules if importlib.util.find_spec(m) is None)
    try:
        run = subprocess.run([found, "-c", _PROBE, *modules], capture_output=True, text=True,
                             timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(cannot run it: {exc})"
    return run.stdout.strip() if run.returncode == 0 else f"(it failed: {run.stderr[-300:]})"


def check_spark_python(spark: Any, modules: tuple[str, ...] = WORKER_MODULES) -> None:
    """Raise :class:`SetupError` when the Python that Spark starts for its workers cannot
    import ``modules``. Checked where the executors run on this machine (``local`` masters);
    on a cluster every node needs the package (docs/deployment.md)."""
    sc = spark.sparkContext
    if not str(sc.master).startswith("local"):
        return
    python = str(getattr(sc, "pythonExec", None) or os.environ.get("PYSPARK_PYTHON", "python3"))
    missing = _missing(python, modules)
    if not missing:
        return
    raise SetupError(
        f"Spark runs its Python workers with {python!r} (PYSPARK_PYTHON when the SparkSession "
        f"was created, else python3 on PATH), which cannot import {missing}. Set "
        f"os.environ['PYSPARK_PYTHON'] = sys.executable ({sys.executable}) before creating "
        "the SparkSession (the config spark.pyspark.python is not enough: Spark finds Python "
        f"data sources with PYSPARK_PYTHON), or install the package there: {python} -m pip "
        "install pyspark-kafka-share")
