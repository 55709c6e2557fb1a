"""progress(): the source's report read the same from every Spark line's progress shapes."""

from __future__ import annotations

import json
from typing import Any

import pyspark_kafka_share as ks
from pyspark_kafka_share.query_progress import SourceProgress, progress

REPORT = {"lag": 7, "lagByPartition": {"orders:0": 7}, "lastBatch": {"batch": 3, "records": 5}}
OFFSET = {"seq": 4, "parts": 2, "max": 0, "backlog": 7, "ends": {"orders:0": 12}, "poll": 0}


def _progress(source: dict[str, Any]) -> dict[str, Any]:
    return {"batchId": 9, "timestamp": "2026-11-25T14:00:00.000Z",
            "sources": [{"description": "PythonMicroBatchStream", "numInputRows": 5, **source}]}


class _Progress:
    """A StreamingQueryProgress as PySpark gives it: ``json`` is the text."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.json = json.dumps(data)


class _Query:
    def __init__(self, last: Any) -> None:
        self.lastProgress = last
        self.recentProgress = [last] if last is not None else []


def test_spark_4_2_plus_latest_offset_is_the_report() -> None:
    data = _progress({"endOffset": OFFSET, "latestOffset": REPORT})
    assert progress(_Query(_Progress(data))) == SourceProgress(
        9, 5, 7, {"orders:0": 7}, {"batch": 3, "records": 5}, "2026-11-25T14:00:00.000Z")


def test_spark_4_1_report_in_end_offset_as_a_python_repr() -> None:
    # 4.1: latestOffset None in data batches; endOffset a Python repr (single quotes).
    data = _progress({"endOffset": repr({**OFFSET, **REPORT}), "latestOffset": None})
    got = progress(_Progress(data))
    assert got is not None and got.lag == 7 and got.last_batch["records"] == 5


def test_spark_4_0_report_in_end_offset_as_json_text() -> None:
    data = _progress({"endOffset": json.dumps({**OFFSET, **REPORT})})
    got = progress(data)
    assert got is not None and got.lag_by_partition == {"orders:0": 7}


def test_unknown_lag_and_no_progress_yet() -> None:
    data = _progress({"endOffset": {**OFFSET, "lag": None, "lastBatch": {}}})
    got = progress(json.dumps(data))
    assert got is not None and got.lag is None and got.last_batch == {}
    assert progress(_Query(None)) is None
    # Another source only (or the initial offset, before the first report): None.
    assert progress(_progress({"endOffset": OFFSET, "latestOffset": "{\"a\": 1}"})) is None


def test_exported_from_the_package() -> None:
    assert ks.progress is progress and ks.SourceProgress is SourceProgress
