"""Spark's built-in ``kafka`` source for the benchmark: its jar and what it needs beyond pyspark.

``spark-sql-kafka-0-10_2.13`` of the installed pyspark version is fetched from Maven Central
once, with Maven (a generated pom + ``dependency:copy-dependencies``, like
``pyspark_kafka_share.localkafka.ensure_jars``), into
``cache_dir()/spark-sql-kafka-<version>/jars``. Jars whose artifact pyspark already ships are
dropped. A ``.complete`` marker makes every later run use the cache without calling Maven.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

from pyspark_kafka_share.localkafka import cache_dir

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>pyspark-kafka-share</groupId>
  <artifactId>bench-spark-sql-kafka</artifactId>
  <version>{spark}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.spark</groupId>
      <artifactId>spark-sql-kafka-0-10_{scala}</artifactId>
      <version>{wanted}</version></dependency>
  </dependencies>
</project>
"""


def pyspark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def pyspark_jar_artifacts() -> set[str]:
    """Artifact ids of the jars pyspark ships (``pyspark/jars``), from their file names."""
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    names: set[str] = set()
    for jar in jars.glob("*.jar"):
        parts = jar.stem.split("-")
        # artifact-id-1.2.3[-classifier]: the artifact id ends before the first part that
        # starts with a digit *and* contains a dot or is all digits (e.g. "0-10_2.13" of
        # spark-sql-kafka-0-10_2.13 contains an underscore, so it is not a version).
        for i, part in enumerate(parts):
            if i > 0 and part[:1].isdigit() and "_" not in part:
                names.add("-".join(parts[:i]))
                break
        else:
            names.add(jar.stem)
    return names


# Used when Maven Central has no spark-sql-kafka of pyspark's own version (Spark's jars can
# reach Central weeks after pyspark reaches PyPI: pyspark 4.3.0 has none as of this writing).
# A Maven version range cannot be used instead: resolving a range reads the poms of every
# version in it, and Spark's previews declare a repository host that does not resolve.
FALLBACK_CONNECTOR = "4.2.0"


def connector_version() -> str:
    """The spark-sql-kafka version actually used (after :func:`ensure_spark_kafka_jars`)."""
    marker = cache_dir() / f"spark-sql-kafka-{pyspark_version()}" / ".complete"
    return marker.read_text().strip() if marker.exists() else "?"


def ensure_spark_kafka_jars(connector: str | None = None, *, scala: str = "2.13",
                            quiet: bool = False) -> list[Path]:
    """The jars to put on ``spark.jars`` for the built-in ``kafka`` source (cached).

    ``connector`` (default: pyspark's version) is the spark-sql-kafka version wanted. When
    Maven Central has no connector of pyspark's version, :data:`FALLBACK_CONNECTOR` is used,
    with a warning; :func:`connector_version` tells which one was fetched.
    """
    version = pyspark_version()
    root = cache_dir() / f"spark-sql-kafka-{version}"
    libs = root / "jars"
    done = root / ".complete"
    if done.exists() and connector is not None and done.read_text().strip() != connector:
        done.unlink()
    if not done.exists():
        root.mkdir(parents=True, exist_ok=True)
        with open(root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.exists():
                used = _fetch(root, libs, connector, version, scala, quiet=quiet)
                done.write_text(used)
    jars = sorted(libs.glob("*.jar"))
    if not jars:
        raise RuntimeError(f"no jars in {libs}; delete {root} and run again")
    used = done.read_text().strip()
    if used != version and not quiet:
        print(f"note: using spark-sql-kafka {used} with pyspark {version} (Maven Central has "
              f"no spark-sql-kafka {version})", file=sys.stderr)
    return jars


def _mvn_copy(root: Path, staging: Path, wanted: str, scala: str, version: str) -> str:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("Maven ('mvn') is needed to fetch spark-sql-kafka from Maven Central")
    (root / "pom.xml").write_text(_POM.format(spark=version, wanted=wanted, scala=scala))
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [mvn, "-B", "-q", "-f", str(root / "pom.xml"), "dependency:copy-dependencies",
           f"-DoutputDirectory={staging}", "-DincludeScope=runtime",
           "-Dmdep.useRepositoryLayout=true"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return "" if proc.returncode == 0 else (proc.stdout + proc.stderr)[-3000:]


def _fetch(root: Path, libs: Path, connector: str | None, version: str, scala: str, *,
           quiet: bool) -> str:
    """Download into ``libs``; return the connector version fetched."""
    wanted = connector or version
    if not quiet:
        print(f"fetching spark-sql-kafka-0-10_{scala}:{wanted} and its dependencies into "
              f"{libs} ...", file=sys.stderr)
    staging = root / "repo.partial"
    error = _mvn_copy(root, staging, wanted, scala, version)
    missing = "Could not find artifact" in error or "was not found in" in error
    if error and missing and connector is None:
        print(f"warning: Maven Central has no spark-sql-kafka-0-10_{scala}:{version}; "
              f"falling back to {FALLBACK_CONNECTOR}", file=sys.stderr)
        wanted = FALLBACK_CONNECTOR
        error = _mvn_copy(root, staging, wanted, scala, version)
    if error:
        raise RuntimeError(f"Maven could not fetch spark-sql-kafka-0-10_{scala}:{wanted}:\n"
                           f"{error}")
    found = sorted(staging.rglob(f"spark-sql-kafka-0-10_{scala}-*.jar"))
    if not found:
        raise RuntimeError(f"Maven fetched no spark-sql-kafka jar into {staging}")
    used = found[0].parent.name
    shipped = pyspark_jar_artifacts()
    flat = root / "jars.partial"
    shutil.rmtree(flat, ignore_errors=True)
    flat.mkdir()
    kept, dropped = [], []
    for jar in sorted(staging.rglob("*.jar")):
        artifact = jar.parent.parent.name  # <group path>/<artifact>/<version>/<file>.jar
        if artifact in shipped:
            dropped.append(jar.name)
            continue
        shutil.copy2(jar, flat / jar.name)
        kept.append(jar.name)
    (root / "kept.txt").write_text("\n".join(kept) + "\n")
    (root / "dropped-shipped-by-pyspark.txt").write_text("\n".join(dropped) + "\n")
    shutil.rmtree(libs, ignore_errors=True)
    flat.rename(libs)
    shutil.rmtree(staging, ignore_errors=True)
    return used


if __name__ == "__main__":
    for path in ensure_spark_kafka_jars():
        print(path)
    print(f"connector version: {connector_version()}")
