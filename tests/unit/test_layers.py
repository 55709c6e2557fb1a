"""The package's layers, kept by walking every module's imports (function-level ones too).

- The kernel (``_kafka``) talks to Kafka and needs nothing above it: no façade (``admin``,
  ``cli``), no front-end (``source``, ``workers``), no harness, no Spark.
- The two front-ends stand side by side on the kernel: ``source`` never imports ``workers``,
  nor ``workers`` ``source``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import pyspark_kafka_share

PACKAGE = Path(pyspark_kafka_share.__file__).parent
NAME = "pyspark_kafka_share"

ABOVE_THE_KERNEL = (*(f"{NAME}.{m}" for m in (
    "admin", "cli", "source", "workers", "harness", "localkafka", "_spark")), "pyspark")


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``; ``from a import b`` gives ``a.b`` too
    (``b`` may be a module), relative imports resolved against the file's package."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            yield node.lineno, base
            yield from ((node.lineno, f"{base}.{a.name}") for a in node.names)


def _violations(folder: str, banned: tuple[str, ...]) -> list[str]:
    root = PACKAGE / folder
    assert root.is_dir(), root
    return [f"{path.relative_to(PACKAGE)}:{line} imports {module}"
            for path in sorted(root.rglob("*.py")) for line, module in _imports(path)
            if any(module == b or module.startswith(f"{b}.") for b in banned)]


def test_the_kernel_imports_nothing_above_it() -> None:
    assert _violations("_kafka", ABOVE_THE_KERNEL) == []


@pytest.mark.parametrize(("folder", "other"), [("source", "workers"), ("workers", "source")])
def test_the_front_ends_do_not_import_each_other(folder: str, other: str) -> None:
    assert _violations(folder, (f"{NAME}.{other}",)) == []


def test_the_check_sees_imports_inside_functions_and_imported_names() -> None:
    found = [module for _, module in _imports(PACKAGE / "_kafka" / "group.py")]
    assert "confluent_kafka.admin" in found  # imported inside functions only
    assert f"{NAME}._kafka.partition.TopicPartition" in found


def test_the_control_transports_import_one_way() -> None:
    """``workers.control`` (TCP, and the choice of transport) may open ``control_kafka``;
    neither ``control_kafka`` nor the shared driver state (``control_state``) imports it
    back, and the shared state imports neither transport."""
    control = f"{NAME}.workers.control"

    def imported(name: str) -> set[str]:
        return {m for _, m in _imports(PACKAGE / "workers" / f"{name}.py")}

    assert not {m for m in imported("control_kafka") if m == control or
                m.startswith(f"{control}.")}
    assert not {m for m in imported("control_state") if m.startswith(control)}
