"""The source's run-time notices: AvailableNow on Spark < 4.2, batches far over the cap."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from pyspark_kafka_share.source.notices import available_now_notice, oversized_batch_notice
from pyspark_kafka_share.source.options import parse_options

BASE = {"kafka.bootstrap.servers": "localhost:9092", "kafka.group.id": "orders",
        "subscribe": "orders", "delivery": "at-most-once"}


def test_available_now_notice_names_the_records_left_and_the_fix() -> None:
    opts = parse_options(BASE)
    notice = available_now_notice(opts, 50_000, admission_control=False, version="4.1.4")
    assert notice is not None
    key, text = notice
    assert key == "available-now"
    assert "50000 records waiting" in text and "'orders'" in text
    assert "PySpark 4.1.4" in text and "ONE micro-batch" in text
    assert "maxBatchDurationMs (10000 ms)" in text
    assert "upgrade to PySpark 4.2" in text and "progress(query).lag == 0" in text


def test_available_now_notice_names_the_cap_and_stays_quiet_when_it_does_not_apply() -> None:
    opts = parse_options({**BASE, "maxRecordsPerTrigger": "2000",
                          "maxBatchDurationMs": "5000"})
    notice = available_now_notice(opts, 10, admission_control=False, version="4.0.5")
    assert notice is not None
    assert "maxBatchDurationMs (5000 ms) and maxRecordsPerTrigger (2000)" in notice[1]
    assert available_now_notice(opts, 10, admission_control=True) is None  # Spark 4.2+
    assert available_now_notice(opts, 0, admission_control=False) is None  # nothing waits
    assert available_now_notice(opts, None, admission_control=False) is None  # unknown


def test_oversized_batch_notice_above_twice_the_cap() -> None:
    opts = parse_options({**BASE, "maxRecordsPerTrigger": "2000"})
    assert oversized_batch_notice(opts, {"batch": 2, "records": 4000}) is None
    notice = oversized_batch_notice(opts, {"batch": 3, "records": 26_478})
    assert notice is not None
    key, text = notice
    assert key == "oversized-batch"
    assert "batch 3" in text and "26478 records" in text and "13.2x" in text
    assert "maxRecordsPerTrigger=2000" in text
    assert "linger.ms" in text and "batch.size" in text
    assert oversized_batch_notice(parse_options(BASE), {"records": 10**6}) is None  # no cap


class _Reader:
    """The reader's notice bookkeeping without Spark (KafkaShareStreamReader._notice)."""

    def __init__(self) -> None:
        self.warned: set[str] = set()


def test_a_notice_is_logged_once_per_run(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("pyspark")
    from pyspark_kafka_share.source.datasource import _LOG, KafkaShareStreamReader

    reader: Any = _Reader()
    _LOG.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.WARNING, logger=_LOG.name):
            for _ in range(3):
                KafkaShareStreamReader._notice(reader, ("oversized-batch", "too big"))
            KafkaShareStreamReader._notice(reader, None)
    finally:
        _LOG.removeHandler(caplog.handler)
    assert [r.getMessage() for r in caplog.records] == ["too big"]
