"""Pure unit tests of the harness: no JVM is started."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from pyspark_kafka_share.errors import KafkaShareError, LocalKafkaError
from pyspark_kafka_share.localkafka import LocalKafka
from pyspark_kafka_share.localkafka import broker as localkafka


def test_cache_dir_honours_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(localkafka.ENV_CACHE, str(tmp_path / "c"))
    assert localkafka.cache_dir() == tmp_path / "c"
    monkeypatch.delenv(localkafka.ENV_CACHE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert localkafka.cache_dir() == tmp_path / "pyspark-kafka-share"


def test_cluster_id_is_kafka_uuid_form_and_never_looks_like_an_option() -> None:
    ids = [localkafka._cluster_id() for _ in range(5000)]  # ~78 would start with '-' unchecked
    for cid in ids:
        assert len(cid) == 22
        assert len(base64.urlsafe_b64decode(cid + "==")) == 16
        assert not cid.startswith("-")


def test_single_node_properties() -> None:
    props = LocalKafka(lock_duration_ms=2500, extra_config={"num.partitions": "3"}) \
        .server_properties(9092, 9093, Path("/tmp/x"))
    assert props["share.coordinator.state.topic.replication.factor"] == "1"
    assert props["share.coordinator.state.topic.min.isr"] == "1"
    assert props["group.share.record.lock.duration.ms"] == "2500"
    assert props["listeners"].startswith("PLAINTEXT://127.0.0.1:9092")
    assert props["num.partitions"] == "3", "extra_config must override defaults"


def test_missing_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(localkafka.ENV_BOOTSTRAP, raising=False)
    monkeypatch.setattr(localkafka.shutil, "which", lambda name: None)
    with pytest.raises(LocalKafkaError, match="'java' was not found") as info:
        LocalKafka().start()
    assert isinstance(info.value, KafkaShareError)


def test_bootstrap_before_start_is_an_error() -> None:
    with pytest.raises(LocalKafkaError, match="not started"):
        _ = LocalKafka().bootstrap_servers
