"""The jar cache keeps Maven to a repository of its own (never ``~/.m2``), and
:func:`ivy_settings` gives Spark Maven Central only, under the cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from pyspark_kafka_share.errors import LocalKafkaError
from pyspark_kafka_share.harness import jars


def test_maven_fetches_into_the_caches_own_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(jars.ENV_CACHE, str(tmp_path / "cache"))
    monkeypatch.setattr(jars, "require_tool", lambda name, why: "mvn")
    commands: list[list[str]] = []

    def maven(cmd: list[str], progress: object) -> tuple[int, str]:
        commands.append(cmd)
        return 1, "stopped here"

    monkeypatch.setattr(jars, "_run_maven", maven)
    with pytest.raises(LocalKafkaError):
        jars.fetch([jars.Artifact("org.example", "x", "1")], tmp_path / "dest",
                   work=tmp_path / "work")
    assert f"-Dmaven.repo.local={tmp_path / 'cache' / 'maven-repository'}" in commands[0]


def test_ivy_settings_name_maven_central_only_under_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(jars.ENV_CACHE, str(tmp_path))
    conf = jars.ivy_settings()
    assert conf == {"spark.jars.ivySettings": str(tmp_path / "ivy" / "ivysettings.xml"),
                    "spark.jars.ivy": str(tmp_path / "ivy")}
    text = Path(conf["spark.jars.ivySettings"]).read_text()
    assert jars.MAVEN_CENTRAL in text and text.count("<ibiblio ") == 1
    assert "<filesystem" not in text and "<chain" not in text  # no local-m2-cache, no ~/.ivy2
    assert jars.ivy_settings() == conf  # again: the same file
