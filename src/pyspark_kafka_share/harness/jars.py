"""The one jar cache: artifacts from Maven Central, fetched once with Maven, kept on disk.

Two users: :func:`ensure_jars` (Apache Kafka's broker and tools, for :class:`LocalKafka`) and
the benchmark (Spark's ``kafka`` connector). Each cache entry is a directory under
:func:`cache_dir`, filled once under a file lock (:func:`cached`) by :func:`fetch`, which
writes a pom naming the artifacts and runs ``mvn dependency:copy-dependencies``. A
``.complete`` marker makes every later call use the entry without calling Maven.

With ``quiet=False``, :func:`fetch` prints a line on stderr per jar Maven downloads (a first
run of :func:`ensure_jars` downloads about 70 MB, Maven's own plugins included).

Maven keeps what it downloads in a repository of the cache's own (:func:`maven_repository`),
never in the user's ``~/.m2``, where a POM left without its jar breaks Spark's ``--packages``
resolution (Ivy reads ``~/.m2`` as ``local-m2-cache``). And the Spark sessions this project
starts with ``spark.jars.packages`` (the Delta Lake example) take :func:`ivy_settings`: Maven
Central only, with an Ivy cache under the package's cache, so no ``~/.m2`` entry can break them.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from pyspark_kafka_share.errors import ArtifactNotFoundError, LocalKafkaError

__all__ = [
    "ENV_CACHE",
    "ENV_KAFKA_VERSION",
    "KAFKA_VERSION",
    "KAFKA_VERSIONS",
    "Artifact",
    "ArtifactNotFoundError",
    "Jar",
    "cache_dir",
    "cached",
    "ensure_jars",
    "fetch",
    "ivy_settings",
    "kafka_artifacts",
    "kafka_version",
    "maven_repository",
]

KAFKA_VERSION = "4.4.0"
"""The Apache Kafka version the harness runs by default (share groups are GA from 4.2)."""

KAFKA_VERSIONS = ("4.2.2", "4.3.1", "4.4.0")
"""The newest release of each Apache Kafka line tested (docs/compatibility.md)."""

ENV_KAFKA_VERSION = "PYSPARK_KAFKA_SHARE_KAFKA_VERSION"
"""Environment variable: the Apache Kafka version :class:`LocalKafka` runs (default
:data:`KAFKA_VERSION`); ``make test-versions`` sets it per broker line."""

_VERSION_RE = re.compile(r"4\.(?:[2-9]|[1-9][0-9])\.[0-9]+")

ENV_CACHE = "PYSPARK_KAFKA_SHARE_CACHE"
"""Environment variable: directory holding the downloaded jars."""

_LOG4J_VERSION = "2.24.3"
_SLF4J_VERSION = "2.0.17"
_MARKER = ".complete"


def cache_dir() -> Path:
    """The directory holding downloaded jars (``$PYSPARK_KAFKA_SHARE_CACHE``)."""
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pyspark-kafka-share"


def maven_repository() -> Path:
    """Maven's local repository for :func:`fetch`: ``cache_dir()/maven-repository``."""
    return cache_dir() / "maven-repository"


MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"

_IVY_SETTINGS = f"""<ivysettings>
  <!-- pyspark-kafka-share: Maven Central only; never ~/.m2 (local-m2-cache), where a POM
       without its jar makes Spark's resolution fail. -->
  <settings defaultResolver="central"/>
  <resolvers>
    <ibiblio name="central" m2compatible="true" root="{MAVEN_CENTRAL}"/>
  </resolvers>
</ivysettings>
"""


def ivy_settings() -> dict[str, str]:
    """Spark configs for a session that resolves ``spark.jars.packages``: Ivy settings with
    Maven Central as the only resolver (no ``~/.m2``, no ``~/.ivy2`` local repository) and
    Ivy's home under :func:`cache_dir` (``ivy/``). Written once; safe to call again."""
    home = cache_dir() / "ivy"
    home.mkdir(parents=True, exist_ok=True)
    settings = home / "ivysettings.xml"
    if not settings.is_file() or settings.read_text() != _IVY_SETTINGS:
        tmp = home / f".ivysettings.{os.getpid()}"
        tmp.write_text(_IVY_SETTINGS)
        tmp.replace(settings)
    return {"spark.jars.ivySettings": str(settings), "spark.jars.ivy": str(home)}


def require_tool(name: str, why: str) -> str:
    """The path of ``name`` on PATH, or a :class:`LocalKafkaError` saying how to install it."""
    path = shutil.which(name)
    if path is None:
        raise LocalKafkaError(
            f"{name!r} was not found on PATH; {why}. Install it (Debian: "
            f"'apt-get install {'openjdk-17-jre-headless' if name == 'java' else 'maven'}') "
            f"or set PYSPARK_KAFKA_SHARE_BOOTSTRAP to use an existing broker."
        )
    return path


@dataclass(frozen=True)
class Artifact:
    """Maven coordinates ``group:artifact:version``."""

    group: str
    artifact: str
    version: str

    def __str__(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"


@dataclass(frozen=True)
class Jar:
    """One jar :func:`fetch` resolved: its coordinates and file."""

    artifact: Artifact
    path: Path


def kafka_artifacts(version: str = KAFKA_VERSION) -> list[Artifact]:
    """What the broker harness runs: Kafka's server and tools, and a log4j2 binding."""
    return [
        Artifact("org.apache.kafka", "kafka_2.13", version),
        Artifact("org.apache.kafka", "kafka-tools", version),
        Artifact("org.slf4j", "slf4j-api", _SLF4J_VERSION),
        Artifact("org.apache.logging.log4j", "log4j-slf4j2-impl", _LOG4J_VERSION),
        Artifact("org.apache.logging.log4j", "log4j-core", _LOG4J_VERSION),
    ]


def cached(name: str, fill: Callable[[Path], str], *,
           accept: Callable[[str], bool] | None = None) -> tuple[Path, str]:
    """The cache entry ``cache_dir()/name``, filled once; returns it and its marker's text.

    ``fill(entry)`` populates the entry and returns the text to keep in its ``.complete``
    marker (e.g. the version fetched). An entry whose marker ``accept`` rejects is filled
    again. Safe to call concurrently from several processes (a file lock serialises fills).
    """
    root = cache_dir() / name
    done = root / _MARKER

    def usable() -> str | None:
        try:
            text = done.read_text().strip()
        except FileNotFoundError:
            return None
        return text if accept is None or accept(text) else None

    text = usable()
    if text is not None:
        return root, text
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = usable()
        if text is None:
            done.unlink(missing_ok=True)
            text = fill(root).strip()
            done.write_text(text)
    return root, text


def kafka_version() -> str:
    """The Apache Kafka version to run: ``$PYSPARK_KAFKA_SHARE_KAFKA_VERSION``, else
    :data:`KAFKA_VERSION`. Raises :class:`LocalKafkaError` for a value that names no Kafka
    release with share groups (4.2.0 or newer, written ``major.minor.patch``)."""
    value = os.environ.get(ENV_KAFKA_VERSION, "").strip()
    if not value:
        return KAFKA_VERSION
    if not _VERSION_RE.fullmatch(value):
        raise LocalKafkaError(
            f"{ENV_KAFKA_VERSION}={value!r} is no Apache Kafka release with share groups: "
            f"give a version 4.2.0 or newer as major.minor.patch (tested: "
            f"{', '.join(KAFKA_VERSIONS)}), or unset it for {KAFKA_VERSION}")
    return value


def ensure_jars(version: str | None = None, *, quiet: bool = True) -> Path:
    """Fetch the broker and tools jars from Maven Central once; return the directory of jars.

    ``version``: by default :func:`kafka_version` (``$PYSPARK_KAFKA_SHARE_KAFKA_VERSION``).
    With ``quiet=False``, progress goes to stderr (a first fetch takes a minute or two).
    Safe to call concurrently from several processes (a file lock serialises the download).
    """

    version = kafka_version() if version is None else version

    def fill(root: Path) -> str:
        fetch(kafka_artifacts(version), root / "libs", work=root, quiet=quiet,
              what=f"Apache Kafka {version} jars")
        return version

    root, _ = cached(f"kafka-{version}", fill)
    return root / "libs"


# -- fetching with Maven ---------------------------------------------------------------------

_POM_HEAD = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>pyspark-kafka-share</groupId>
  <artifactId>{name}</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
"""
_POM_DEP = ("    <dependency><groupId>{a.group}</groupId><artifactId>{a.artifact}</artifactId>"
            "<version>{a.version}</version></dependency>\n")
_POM_TAIL = "  </dependencies>\n</project>\n"

_NOT_FOUND = ("Could not find artifact", "was not found in", "Failure to find")
_DOWNLOADED = re.compile(r"Downloaded from [^:]+: (\S+) \(([^)]*)\)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _pom(name: str, artifacts: Sequence[Artifact]) -> str:
    return _POM_HEAD.format(name=name) + "".join(_POM_DEP.format(a=a) for a in artifacts) \
        + _POM_TAIL


class _Progress:
    """Turns Maven's transfer log into one stderr line per downloaded jar (and pom counts)."""

    POMS_PER_LINE = 50

    def __init__(self, out: TextIO | None) -> None:
        self.out = out
        self.jars = 0
        self.poms = 0
        self.started = time.monotonic()

    def _say(self, text: str) -> None:
        if self.out is not None:
            print(text, file=self.out, flush=True)

    def feed(self, line: str) -> None:
        match = _DOWNLOADED.search(_ANSI.sub("", line))
        if match is None:
            return
        url, size = match.group(1), match.group(2).split(" at ")[0]
        if url.endswith(".jar"):
            self.jars += 1
            self._say(f"  downloaded {url.rsplit('/', 1)[-1]} ({size})")
        elif url.endswith(".pom"):
            self.poms += 1
            if self.poms % self.POMS_PER_LINE == 0:
                self._say(f"  resolving dependencies: {self.poms} poms read")

    def finish(self, jars: int, dest: Path) -> None:
        took = time.monotonic() - self.started
        how = f"{self.jars} jars downloaded" if self.jars else \
            f"all were in {maven_repository()}"
        self._say(f"done: {jars} jars in {dest} ({how}; {took:.0f} s)")


def _run_maven(cmd: list[str], progress: _Progress) -> tuple[int, str]:
    """Run Maven, feeding each output line to ``progress``; return (exit code, output tail)."""
    tail: deque[str] = deque(maxlen=60)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace")
    assert proc.stdout is not None
    with proc:
        for line in proc.stdout:
            progress.feed(line)
            tail.append(_ANSI.sub("", line))
    return proc.returncode, "".join(tail)[-3000:]


def _artifact_of(jar: Path, staging: Path) -> Artifact:
    """Coordinates from a repository-layout path ``<group/path>/<artifact>/<version>/x.jar``."""
    parts = jar.relative_to(staging).parts
    return Artifact(".".join(parts[:-3]), parts[-3], parts[-2])


def fetch(artifacts: Sequence[Artifact], dest: Path, *, work: Path, quiet: bool = True,
          what: str | None = None, keep: Callable[[Jar], bool] | None = None) -> list[Jar]:
    """Fetch ``artifacts`` and their runtime dependencies with Maven into ``dest`` (flat).

    ``work`` holds the generated pom and the staging directory; ``dest`` is replaced only when
    everything was fetched. ``keep`` may drop jars (e.g. ones a classpath already has).
    Returns the jars kept, in ``dest``. Raises :class:`ArtifactNotFoundError` if Maven Central
    has no such artifact, :class:`LocalKafkaError` for other failures.
    """
    what = what or ", ".join(map(str, artifacts))
    mvn = require_tool("mvn", "Maven fetches jars from Maven Central")
    work.mkdir(parents=True, exist_ok=True)
    pom = work / "pom.xml"
    pom.write_text(_pom(work.name, artifacts))
    staging = work / f"{dest.name}.partial"
    flat = work / f"{dest.name}.new"
    for path in (staging, flat):
        shutil.rmtree(path, ignore_errors=True)
    progress = _Progress(None if quiet else sys.stderr)
    if not quiet:
        print(f"fetching {what} from Maven Central into {dest} (once; later runs use the "
              f"cache) ...", file=sys.stderr, flush=True)
    code, output = _run_maven(
        [mvn, "-B", "-f", str(pom), "dependency:copy-dependencies",
         f"-Dmaven.repo.local={maven_repository()}",  # never the user's ~/.m2
         f"-DoutputDirectory={staging}", "-DincludeScope=runtime",
         "-Dmdep.useRepositoryLayout=true", "-Dstyle.color=never"],
        progress,
    )
    try:
        if code != 0:
            kind = ArtifactNotFoundError if any(s in output for s in _NOT_FOUND) \
                else LocalKafkaError
            raise kind(f"Maven could not fetch {what} (exit {code}). Check that Maven Central "
                       f"is reachable. Output:\n{output}")
        flat.mkdir()
        kept: list[Jar] = []
        for path in sorted(staging.rglob("*.jar")):
            jar = Jar(_artifact_of(path, staging), path)
            if keep is not None and not keep(jar):
                continue
            shutil.copy2(path, flat / path.name)
            kept.append(Jar(jar.artifact, dest / path.name))
        if not kept:
            raise LocalKafkaError(f"Maven fetched no jars of {what} into {staging}")
        shutil.rmtree(dest, ignore_errors=True)
        flat.rename(dest)
    finally:
        for path in (staging, flat):
            shutil.rmtree(path, ignore_errors=True)
    progress.finish(len(kept), dest)
    return kept
