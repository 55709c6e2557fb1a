"""The Delta Lake example (demo/delta_pipeline.py, docs/examples.md) exactly once through a
``kill -9`` of the driver mid-batch.

The pipeline runs as its own process, as a user runs it: its SparkSession needs the Delta jars
and extensions when its JVM starts, which the tests' shared session has not. The first run
holds one task of its second batch before END (after it journaled and acknowledged its
records) and the test kills the driver's process group then; the second run resumes from the
checkpoint and drains the group. Skipped without delta-spark: ``make test-versions``
installs the release that fits each Spark line (docs/examples.md).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pyspark_kafka_share.harness import LocalKafka
from pyspark_kafka_share.source.journal.journal import Journal

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("delta") is None,
    reason="delta-spark is not installed: pip install the release that fits this PySpark "
           "(docs/examples.md: 4.0.x for Spark 4.0, 4.4.0 for 4.1 and 4.2; none supports "
           "Spark 4.3 yet); make test-spark-lines installs it for 4.0 and 4.1")

SCRIPT = Path(__file__).resolve().parents[2] / "demo" / "delta_pipeline.py"
RECORDS = 3000


def _pipeline(kafka: LocalKafka, topic: str, group: str, base: Path,
              *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), "--bootstrap-server", kafka.bootstrap_servers,
         "--topic", topic, "--group", group, "--dir", str(base),
         "--max-records-per-trigger", "1000", "--timeout", "300", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True)  # its own process group: the JVM dies with the driver


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)


@pytest.mark.spark_subset
@pytest.mark.delta
def test_delta_pipeline_exactly_once_through_a_driver_kill_mid_batch(
    kafka: LocalKafka, topic_factory: object, group: str, tmp_path: Path
) -> None:
    assert callable(topic_factory)
    topic = topic_factory(3)
    kafka.set_group_config(group, "share.record.lock.duration.ms", 3000)
    # Small producer batches: maxRecordsPerTrigger=1000 makes three batches or more.
    kafka.produce(topic, (json.dumps({"id": i, "customer": f"c{i % 7}", "amount": i / 4})
                          .encode() for i in range(RECORDS)),
                  producer_config={"batch.size": "1", "linger.ms": "0"})
    base = tmp_path / "pipeline"
    started = time.monotonic()
    first = _pipeline(kafka, topic, group, base, "--option",
                      "_faultInjection=sleep-before-end:seq=2:part=0:ms=120000")
    try:
        # Task 1 of the source's batch 2 ENDed; task 0 is held before END: mid-batch.
        deadline = time.monotonic() + 300
        journal = base / "journal"
        while time.monotonic() < deadline:
            assert first.poll() is None, first.communicate()[1][-3000:]
            if (journal / "batches").exists() and \
                    Journal(str(journal)).part_log(2, 1).scan().end is not None:
                break
            time.sleep(0.5)
        else:
            pytest.fail("batch 2 never got under way")
        time.sleep(1)
        assert first.poll() is None, "the pipeline ended before it could be killed"
    finally:
        _kill_group(first)
    delta_log = base / "table" / "_delta_log"
    assert delta_log.exists(), "batch 1 did not reach the Delta table before the kill"
    killed = time.monotonic()
    second = _pipeline(kafka, topic, group, base)
    out, err = second.communicate(timeout=420)
    print(f"first run until the kill: {killed - started:.0f} s; the second run: "
          f"{time.monotonic() - killed:.0f} s")
    assert second.returncode == 0, err[-3000:]
    counts = json.loads(out.strip().splitlines()[-1])
    assert counts["rows"] == RECORDS, counts  # nothing lost, nothing twice
    assert counts["records"] == RECORDS and counts["ids"] == RECORDS, counts
