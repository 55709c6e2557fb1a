"""The machine and the versions a benchmark ran with."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError):
        pass
    return None


def _java_version() -> str:
    java = shutil.which("java")
    if java is None:
        return "?"
    proc = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    lines = (proc.stderr or proc.stdout).splitlines()
    return lines[0].strip() if lines else "?"


def _git(repo: Path, *args: str) -> str:
    git = shutil.which("git")
    if git is None:
        return "?"
    proc = subprocess.run([git, "-C", str(repo), *args], capture_output=True, text=True,
                          check=False)
    return proc.stdout.strip() if proc.returncode == 0 else "?"


def describe(repo: Path, connector: str) -> dict[str, Any]:
    """nproc, CPU model, memory, OS and the versions of everything measured."""
    import confluent_kafka
    import pyarrow
    import pyspark

    from pyspark_kafka_share.harness import KAFKA_VERSION

    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        nproc = os.cpu_count() or 0
    client = getattr(confluent_kafka, "__version__", None) or str(confluent_kafka.version())
    librdkafka = str(confluent_kafka.libversion()[0])
    return {
        "machine": {
            "nproc": nproc,
            "cpu_model": _cpu_model(),
            "memory_gib": _memory_gib(),
            "os": platform.platform(),
        },
        "versions": {
            "python": sys.version.split()[0],
            "pyspark": pyspark.__version__,
            "spark_sql_kafka": connector,
            "confluent_kafka": client,
            "librdkafka": librdkafka,
            "pyarrow": pyarrow.__version__,
            "kafka": KAFKA_VERSION,
            "java": _java_version(),
        },
        "git": {
            "commit": _git(repo, "rev-parse", "--short", "HEAD"),
            "dirty": _git(repo, "status", "--porcelain", "--untracked-files=no") != "",
        },
    }
