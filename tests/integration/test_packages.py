"""Spark's ``--packages`` resolution (``spark.jars.packages``, Ivy) against a POM-only entry in
``~/.m2``, as the project's sessions that resolve packages (the Delta Lake example) start it.

The user's real ``~/.m2`` is never touched: each session runs in a subprocess whose home
(``$HOME`` and the JVM's ``user.home``) and package cache are temporary directories, with
``com.google.code.findbugs:jsr305:3.0.2``'s POM planted there without its jar (the entry that
broke ``make demo SINK=delta`` in issue 41). With Spark's default Ivy settings the session
dies with ``download failed`` (the control); with :func:`ivy_settings` it resolves the jar from
Maven Central into the package's cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

PACKAGE = "com.google.code.findbugs:jsr305:3.0.2"
POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>com.google.code.findbugs</groupId>
  <artifactId>jsr305</artifactId>
  <version>3.0.2</version>
</project>
"""
SESSION = f"""
import sys
from pyspark.sql import SparkSession
from pyspark_kafka_share.harness.jars import ivy_settings
builder = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
           .config("spark.jars.packages", "{PACKAGE}"))
if sys.argv[1] == "project":
    for key, value in ivy_settings().items():
        builder = builder.config(key, value)
spark = builder.getOrCreate()
print("JARS", spark.sparkContext.getConf().get("spark.jars", ""))
spark.stop()
"""


def _session(tmp_path: Path, settings: str) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "home"
    pom = home / ".m2/repository/com/google/code/findbugs/jsr305/3.0.2/jsr305-3.0.2.pom"
    pom.parent.mkdir(parents=True, exist_ok=True)
    pom.write_text(POM)  # the POM without its jar
    env = {**os.environ, "HOME": str(home), "JAVA_TOOL_OPTIONS": f"-Duser.home={home}",
           "PYSPARK_KAFKA_SHARE_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([sys.executable, "-c", SESSION, settings], env=env, check=False,
                          capture_output=True, text=True, timeout=600)


def test_a_pom_only_m2_entry_breaks_default_resolution_not_the_projects(
    tmp_path: Path,
) -> None:
    control = _session(tmp_path / "default", "default")
    assert control.returncode != 0, "the planted POM did not break Spark's default settings"
    assert "local-m2-cache" in control.stderr and "download failed" in control.stderr

    done = _session(tmp_path / "project", "project")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "local-m2-cache" not in done.stderr
    jar = tmp_path / "project/cache/ivy/jars/com.google.code.findbugs_jsr305-3.0.2.jar"
    assert f"JARS file://{jar}" in done.stdout and jar.stat().st_size > 10_000
    pom = tmp_path / "project/home/.m2/repository/com/google/code/findbugs/jsr305/3.0.2"
    assert sorted(p.name for p in pom.iterdir()) == ["jsr305-3.0.2.pom"], "~/.m2 was written"
