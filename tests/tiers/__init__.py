"""The CI tiers' pytest invocations, read from the Makefile as make runs them.

The version tiers (``make test-versions``, ``make test-spark-line-<line>``, ``make
test-kafka-versions``) each run one pytest process per PySpark:Kafka pair, with a selection
built by the Makefile's ``run_pairs``. :func:`tier_invocations` runs those targets for real on
a copy of the Makefile whose pythons are stubs that record their arguments and environment, so
each invocation is exactly what make would start (files, ``-m``/``-k`` expression, broker
version) without a broker, a Spark session or a venv per line.

Each invocation's recorded selection (node ids, collected at 16b8a0a where the tiers selected
by name substrings) is ``tests/tiers/<key>.txt``; ``tests/unit/test_tiers.py`` checks that each
tier still selects at least those tests.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIERS = Path(__file__).resolve().parent

# The targets CI runs (make test-versions) and the developer targets on each of their lines:
# (make target, make variables). test-kafka-versions on every Kafka line covers its default
# (KAFKA_OLDEST only).
TARGETS: tuple[tuple[str, dict[str, str]], ...] = (
    ("test-versions", {}),
    ("test-spark-line-4.0.5", {}),
    ("test-spark-line-4.1.4", {}),
    ("test-kafka-versions", {"KAFKA_TIER_LINES": "4.2.2 4.3.1 4.4.0"}),
)
SPARK_VENVS = ("4.0.5", "4.1.4")
# What the stubbed pythons record: their argv and the environment make gives pytest.
_STUB = """#!{python}
import json, os, sys
with open({log!r}, "a") as log:
    log.write(json.dumps({{"python": sys.argv[0], "args": sys.argv[1:], "env": {{
        k: os.environ.get(k, "") for k in (
            "PYSPARK_KAFKA_SHARE_KAFKA_VERSION", "KAFKA_UPGRADE_FROM", "KAFKA_UPGRADE_TO")}}}})
              + "\\n")
"""


@dataclass(frozen=True)
class Invocation:
    """One pytest process of a tier: ``key`` names its recorded selection file."""

    target: str
    spark: str  # the PySpark line's venv ("main": .venv, the newest)
    kafka: str
    files: tuple[str, ...]
    option: str  # "-m" or "-k"
    expression: str
    env: tuple[tuple[str, str], ...]

    @property
    def key(self) -> str:
        target = "test-spark-line" if self.target.startswith("test-spark-line-") else self.target
        return f"{target}_{self.spark}-{self.kafka}"

    @property
    def recorded(self) -> Path:
        return TIERS / f"{self.key}.txt"


def _stub_tree(root: Path, log: Path) -> None:
    """The Makefile, and venvs whose ``python`` records its call and whose stamps are fresh."""
    shutil.copy(REPO / "Makefile", root / "Makefile")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    stub = _STUB.format(python=sys.executable, log=str(log))
    for venv in (".venv", *(f".venv-spark-{s}" for s in SPARK_VENVS)):
        bin_dir = root / venv / "bin"
        bin_dir.mkdir(parents=True)
        for name, text in (("python", stub), ("kafka-share", "#!/bin/sh\ntrue\n")):
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(stat.S_IRWXU)
        (root / venv / ".installed").touch()
    later = (root / "pyproject.toml").stat().st_mtime + 60  # the stamps are up to date
    for stamp in root.glob(".venv*/.installed"):
        os.utime(stamp, (later, later))


def _parse(target: str, call: dict[str, object]) -> Invocation:
    args = [str(a) for a in call["args"]]  # type: ignore[attr-defined]
    assert args[:2] == ["-m", "pytest"], args
    option, expression = args[-2], args[-1]
    assert option in {"-m", "-k"}, args
    python = Path(str(call["python"]))
    venv = python.parent.parent.name
    spark = "main" if venv == ".venv" else venv.removeprefix(".venv-spark-")
    env = dict(call["env"])  # type: ignore[call-overload]
    return Invocation(target, spark, env["PYSPARK_KAFKA_SHARE_KAFKA_VERSION"],
                      tuple(args[2:-2]), option, expression, tuple(sorted(env.items())))


def tier_invocations() -> list[Invocation]:
    """Every pytest process the tier targets start, deduplicated by :attr:`Invocation.key`."""
    found: dict[str, Invocation] = {}
    for target, variables in TARGETS:
        with tempfile.TemporaryDirectory(prefix="tiers-") as tmp:
            root, log = Path(tmp), Path(tmp) / "calls.jsonl"
            _stub_tree(root, log)
            # PYTEST_ARGS empty: a caller's own (``PYTEST_ARGS=--durations=60 make test``) would
            # trail the selection the tiers' calls are parsed by.
            subprocess.run(["make", "-s", target, "PYTEST_ARGS=",
                            *(f"{k}={v}" for k, v in variables.items())],
                           cwd=root, check=True, capture_output=True, text=True)
            for line in log.read_text().splitlines():
                invocation = _parse(target, json.loads(line))
                found.setdefault(invocation.key, invocation)
    return list(found.values())


def collect(invocation: Invocation) -> list[str]:
    """The node ids ``invocation`` selects (``pytest --collect-only``, this venv's python)."""
    env = {**os.environ, **dict(invocation.env)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *invocation.files, invocation.option, invocation.expression],
        cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if done.returncode not in {0, 5}:  # 5: nothing selected
        raise AssertionError(f"collecting {invocation.key} failed:\n{done.stdout}{done.stderr}")
    return [line for line in done.stdout.splitlines() if "::" in line]


def record() -> None:
    """Write each invocation's selection to ``tests/tiers/<key>.txt`` (python -m tests.tiers)."""
    for invocation in tier_invocations():
        ids = collect(invocation)
        header = (f"# {invocation.target}: PySpark {invocation.spark}, Kafka {invocation.kafka}\n"
                  f"# {invocation.option} {invocation.expression}\n")
        invocation.recorded.write_text(header + "".join(f"{i}\n" for i in sorted(ids)))
        print(f"{invocation.key}: {len(ids)} tests")

