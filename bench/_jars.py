"""Spark's built-in ``kafka`` source for the benchmark: its jar and what it needs beyond pyspark.

``spark-sql-kafka-0-10_2.13`` of the installed pyspark version is fetched from Maven Central
once by the package's jar cache (:mod:`pyspark_kafka_share.harness.jars`, which also holds
the broker's jars) into ``cache_dir()/spark-sql-kafka-<version>/jars``. Jars whose artifact
pyspark already ships are dropped. A ``.complete`` marker makes every later run use the cache
without calling Maven.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pyspark_kafka_share.harness import cache_dir
from pyspark_kafka_share.harness.jars import (
    Artifact,
    ArtifactNotFoundError,
    Jar,
    cached,
    fetch,
)


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
    root, used = cached(
        f"spark-sql-kafka-{version}",
        lambda root: _fetch(root, connector, version, scala, quiet=quiet),
        accept=lambda marker: connector is None or marker == connector,
    )
    libs = root / "jars"
    jars = sorted(libs.glob("*.jar"))
    if not jars:
        raise RuntimeError(f"no jars in {libs}; delete {root} and run again")
    if used != version and not quiet:
        print(f"note: using spark-sql-kafka {used} with pyspark {version} (Maven Central has "
              f"no spark-sql-kafka {version})", file=sys.stderr)
    return jars


def _fetch(root: Path, connector: str | None, version: str, scala: str, *, quiet: bool) -> str:
    """Fetch into ``root/jars`` what pyspark lacks; return the connector version fetched."""
    shipped = pyspark_jar_artifacts()
    dropped: list[str] = []

    def keep(jar: Jar) -> bool:
        if jar.artifact.artifact in shipped:
            dropped.append(jar.path.name)
            return False
        return True

    def attempt(wanted: str) -> list[Jar]:
        dropped.clear()
        return fetch([Artifact("org.apache.spark", f"spark-sql-kafka-0-10_{scala}", wanted)],
                     root / "jars", work=root, quiet=quiet, keep=keep,
                     what=f"spark-sql-kafka-0-10_{scala}:{wanted} and its dependencies")

    wanted = connector or version
    try:
        kept = attempt(wanted)
    except ArtifactNotFoundError:
        if connector is not None:
            raise
        print(f"warning: Maven Central has no spark-sql-kafka-0-10_{scala}:{version}; "
              f"falling back to {FALLBACK_CONNECTOR}", file=sys.stderr)
        wanted = FALLBACK_CONNECTOR
        kept = attempt(wanted)
    if not any(j.artifact.artifact == f"spark-sql-kafka-0-10_{scala}" for j in kept):
        raise RuntimeError(f"Maven fetched no spark-sql-kafka jar into {root / 'jars'}")
    (root / "kept.txt").write_text("\n".join(j.path.name for j in kept) + "\n")
    (root / "dropped-shipped-by-pyspark.txt").write_text("\n".join(dropped) + "\n")
    return wanted


def hadoop_version() -> str:
    """The Hadoop version pyspark ships (its ``hadoop-client-api-<version>.jar``)."""
    import pyspark

    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    if not jars:
        raise RuntimeError("pyspark ships no hadoop-client-api jar: which Hadoop is it?")
    return jars[-1].stem.removeprefix("hadoop-client-api-")


def ensure_s3a_jars(*, quiet: bool = False) -> list[Path]:
    """The jars for Spark's ``s3a://`` filesystem (cached): ``hadoop-aws`` of pyspark's Hadoop
    version and what it needs at runtime that pyspark lacks (the AWS SDK v2 ``bundle``, about
    600 MB, fetched once into ``cache_dir()/hadoop-aws-<version>/jars``). For the benchmark
    only: Spark's ``kafka`` source with its checkpoint on the local S3 server
    (``bench/journal_real.py``)."""
    version = hadoop_version()
    shipped = pyspark_jar_artifacts()

    def fill(root: Path) -> str:
        fetch([Artifact("org.apache.hadoop", "hadoop-aws", version)], root / "jars",
              work=root, quiet=quiet, keep=lambda jar: jar.artifact.artifact not in shipped,
              what=f"hadoop-aws:{version} and the AWS SDK bundle")
        return version

    root, _ = cached(f"hadoop-aws-{version}", fill)
    jars = sorted((root / "jars").glob("*.jar"))
    if not any(j.name.startswith("hadoop-aws-") for j in jars):
        raise RuntimeError(f"no hadoop-aws jar in {root / 'jars'}; delete {root} and run again")
    return jars


if __name__ == "__main__":
    if sys.argv[1:] == ["s3a"]:
        for path in ensure_s3a_jars():
            print(path)
        sys.exit(0)
    for path in ensure_spark_kafka_jars():
        print(path)
    print(f"connector version: {connector_version()}")
