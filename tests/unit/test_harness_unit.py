"""Pure unit tests of the harness and its jar cache: no JVM is started, Maven is faked."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from pyspark_kafka_share.errors import KafkaShareError, LocalKafkaError
from pyspark_kafka_share.harness import LocalKafka, _process, broker_files, jars
from pyspark_kafka_share.harness import broker as localkafka


def test_cache_dir_honours_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(jars.ENV_CACHE, str(tmp_path / "c"))
    assert jars.cache_dir() == tmp_path / "c"
    monkeypatch.delenv(jars.ENV_CACHE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert jars.cache_dir() == tmp_path / "pyspark-kafka-share"


def test_public_names_still_importable() -> None:
    from pyspark_kafka_share import harness as pkg

    for name in ("ENV_BOOTSTRAP", "ENV_CACHE", "KAFKA_VERSION", "LocalKafka", "ProducerRecord",
                 "cache_dir", "ensure_jars"):
        assert name in pkg.__all__ and hasattr(pkg, name)
    assert pkg.ensure_jars is jars.ensure_jars and pkg.cache_dir is jars.cache_dir
    assert not hasattr(localkafka, "local_kafka")


def test_old_import_path_works_with_a_deprecation_warning() -> None:
    import importlib
    import sys

    from pyspark_kafka_share import harness

    for name in [m for m in sys.modules if m.startswith("pyspark_kafka_share.localkafka")]:
        del sys.modules[name]
    with pytest.warns(DeprecationWarning, match="pyspark_kafka_share.harness"):
        old = importlib.import_module("pyspark_kafka_share.localkafka")
    assert old.LocalKafka is harness.LocalKafka and old.__all__ == harness.__all__
    old_broker = importlib.import_module("pyspark_kafka_share.localkafka.broker")
    assert old_broker.LocalKafka is harness.LocalKafka


# -- the jar cache, with a fake Maven ----------------------------------------------------------

_FAKE_MVN = """#!/bin/sh
echo "$*" >> "$FAKE_MVN_CALLS"
for arg in "$@"; do
  case "$arg" in -DoutputDirectory=*) out="${arg#-DoutputDirectory=}";; esac
done
base=https://repo.maven.apache.org/maven2
if [ -n "$FAKE_MVN_MISSING" ]; then
  echo "[ERROR] Failed: Could not find artifact org.example:lib-a:jar:1.0 in central"
  exit 1
fi
if [ -n "$FAKE_MVN_BROKEN" ]; then echo "[ERROR] Connection refused"; exit 1; fi
echo "[INFO] Downloading from central: $base/org/example/lib-a/1.0/lib-a-1.0.pom"
echo "[INFO] Downloaded from central: $base/org/example/lib-a/1.0/lib-a-1.0.pom (1 kB at 5 kB/s)"
echo "[INFO] Downloaded from central: $base/org/example/lib-a/1.0/lib-a-1.0.jar (12 kB at 50 kB/s)"
mkdir -p "$out/org/example/lib-a/1.0" "$out/org/other/lib-b/2.0"
echo a > "$out/org/example/lib-a/1.0/lib-a-1.0.jar"
echo b > "$out/org/other/lib-b/2.0/lib-b-2.0.jar"
echo "<metadata/>" > "$out/org/example/lib-a/maven-metadata-local.xml"
echo "[INFO] BUILD SUCCESS"
"""


@pytest.fixture
def fake_mvn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A fake ``mvn`` on PATH that "fetches" two jars; returns the file logging its calls."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    mvn = bindir / "mvn"
    mvn.write_text(_FAKE_MVN)
    mvn.chmod(0o755)
    calls = tmp_path / "mvn-calls"
    calls.touch()
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MVN_CALLS", str(calls))
    monkeypatch.setenv(jars.ENV_CACHE, str(tmp_path / "cache"))
    return calls


_ARTIFACTS = [jars.Artifact("org.example", "lib-a", "1.0")]


def test_fetch_flattens_filters_and_reports_progress(
        fake_mvn: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def fill(root: Path) -> str:
        got = jars.fetch(_ARTIFACTS, root / "jars", work=root, quiet=False, what="lib-a",
                         keep=lambda jar: jar.artifact.group != "org.other")
        assert got == [jars.Jar(jars.Artifact("org.example", "lib-a", "1.0"),
                                root / "jars" / "lib-a-1.0.jar")]
        return "1.0"

    root, marker = jars.cached("entry", fill)
    assert (root, marker) == (tmp_path / "cache" / "entry", "1.0")
    assert sorted(p.name for p in (root / "jars").iterdir()) == ["lib-a-1.0.jar"]
    assert not list(root.glob("*.partial")) and not list(root.glob("*.new"))
    assert "<artifactId>lib-a</artifactId>" in (root / "pom.xml").read_text()
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("fetching lib-a from Maven Central into ")
    assert err[1] == "  downloaded lib-a-1.0.jar (12 kB)"
    assert err[2].startswith(f"done: 1 jars in {root / 'jars'} (1 jars downloaded; ")
    assert len(err) == 3
    # Cached: neither fill nor Maven runs again.
    assert jars.cached("entry", lambda root: pytest.fail("filled twice")) == (root, "1.0")
    assert len(fake_mvn.read_text().splitlines()) == 1


def test_fetch_is_silent_when_quiet(fake_mvn: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    jars.fetch(_ARTIFACTS, tmp_path / "out", work=tmp_path / "work")
    assert capsys.readouterr().err == ""
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["lib-a-1.0.jar",
                                                                    "lib-b-2.0.jar"]


def test_cache_entry_refilled_when_its_marker_is_not_accepted(fake_mvn: Path) -> None:
    jars.cached("entry", lambda root: "4.2.0")
    root, marker = jars.cached("entry", lambda root: "4.1.0", accept=lambda m: m == "4.1.0")
    assert marker == "4.1.0" and (root / ".complete").read_text() == "4.1.0"


def test_fetch_errors(fake_mvn: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MVN_MISSING", "1")
    with pytest.raises(jars.ArtifactNotFoundError, match="Could not find artifact"):
        jars.cached("entry", lambda root: str(jars.fetch(_ARTIFACTS, root / "j", work=root)))
    assert not (tmp_path / "cache" / "entry" / ".complete").exists()
    monkeypatch.delenv("FAKE_MVN_MISSING")
    monkeypatch.setenv("FAKE_MVN_BROKEN", "1")
    with pytest.raises(LocalKafkaError, match="Connection refused") as info:
        jars.fetch(_ARTIFACTS, tmp_path / "j", work=tmp_path / "w")
    assert not isinstance(info.value, jars.ArtifactNotFoundError)
    assert not (tmp_path / "j").exists()


def test_missing_maven_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)  # jars.shutil is this module
    with pytest.raises(LocalKafkaError, match="'mvn' was not found"):
        jars.fetch(_ARTIFACTS, tmp_path / "j", work=tmp_path / "w")


def test_kafka_artifacts_follow_the_version() -> None:
    names = [str(a) for a in jars.kafka_artifacts("4.2.0")]
    assert "org.apache.kafka:kafka_2.13:4.2.0" in names
    assert "org.apache.kafka:kafka-tools:4.2.0" in names


# -- the harness --------------------------------------------------------------------------------


def test_cluster_id_is_kafka_uuid_form_and_never_looks_like_an_option() -> None:
    ids = [broker_files.cluster_id() for _ in range(5000)]  # ~78 would start with '-' unchecked
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
    monkeypatch.setattr(shutil, "which", lambda name: None)  # jars.shutil is this module
    with pytest.raises(LocalKafkaError, match="'java' was not found") as info:
        LocalKafka().start()
    assert isinstance(info.value, KafkaShareError)


def test_bootstrap_before_start_is_an_error() -> None:
    with pytest.raises(LocalKafkaError, match="not started"):
        _ = LocalKafka().bootstrap_servers


def test_kill_and_restart_need_a_started_broker_of_our_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kafka = LocalKafka()
    for op in (kafka.kill, kafka.restart):
        with pytest.raises(LocalKafkaError, match="not started"):
            op()
    assert not kafka.is_running
    kafka._bootstrap, kafka._external = "127.0.0.1:1", True  # as start() with ENV_BOOTSTRAP
    for op in (kafka.kill, kafka.restart):
        with pytest.raises(LocalKafkaError, match="external broker"):
            op()


def test_tool_log_config_is_warn_on_stderr(tmp_path: Path) -> None:
    libs = tmp_path / "libs"
    libs.mkdir()
    path = broker_files.tool_log4j(libs, "warn")
    text = path.read_text()
    assert "level: WARN" in text and "SYSTEM_ERR" in text and "INFO" not in text
    assert broker_files.tool_log4j(libs, "WARN") == path
    assert broker_files.tool_log4j(libs, "INFO") != path
    with pytest.raises(LocalKafkaError, match="unknown log4j level"):
        broker_files.tool_log4j(libs, "LOUD")


def test_jvm_spawned_from_a_short_lived_thread_outlives_the_thread() -> None:
    """PR_SET_PDEATHSIG fires when the forking *thread* ends: a broker restarted from a timer
    thread must not be killed when the timer returns."""
    procs: list[subprocess.Popen[bytes]] = []
    thread = threading.Thread(target=lambda: procs.append(_process.spawn(["sleep", "60"])))
    thread.start()
    thread.join()
    try:
        time.sleep(0.5)
        assert procs[0].poll() is None, "the child died with the thread that asked for it"
        assert os.getpgid(procs[0].pid) == procs[0].pid  # its own process group
    finally:
        os.killpg(procs[0].pid, signal.SIGKILL)
        procs[0].wait(10)
