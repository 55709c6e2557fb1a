"""The package's layers, kept by walking every module's imports (function-level ones too).

- The kernel (``_kafka``) talks to Kafka and needs nothing above it: no façade (``admin``,
  ``cli``), no front-end (``source``, ``workers``), no harness, no Spark.
- The two front-ends stand side by side on the kernel: ``source`` never imports ``workers``,
  nor ``workers`` ``source``.
- No import cycle among the package's modules (a split that leaves a circle is not yet a
  split), and no module imports another module's private name.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import pyspark_kafka_share

PACKAGE = Path(pyspark_kafka_share.__file__).parent
NAME = "pyspark_kafka_share"

ABOVE_THE_KERNEL = (*(f"{NAME}.{m}" for m in (
    "admin", "cli", "source", "workers", "harness", "localkafka", "_spark")), "pyspark")


def _statements(path: Path, root: Path = PACKAGE) -> Iterator[tuple[ast.stmt, str, list[str]]]:
    """``(node, module, names)`` of every import in ``path`` (a file of the package at
    ``root``): ``import a`` gives ``("a", [])``, ``from a import b, c`` ``("a", ["b", "c"])``;
    relative imports resolved against the file's package."""
    package = ".".join(path.relative_to(root.parent).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node, a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            yield node, base, [a.name for a in node.names]


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every import in ``path``; ``from a import b`` gives ``a.b`` too
    (``b`` may be a module), relative imports resolved against the file's package."""
    for node, base, names in _statements(path):
        yield node.lineno, base
        yield from ((node.lineno, f"{base}.{name}") for name in names)


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


# -- modules: no cycle, no private name of another module -------------------------------------


def _modules(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root`` by dotted name (a package by its
    ``__init__``)."""
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _lazy_attributes(path: Path) -> set[int]:
    """Lines of the imports inside the module-level ``__getattr__`` of ``path`` (PEP 562)."""
    return {node.lineno for f in ast.parse(path.read_text()).body
            if isinstance(f, ast.FunctionDef) and f.name == "__getattr__"
            for node in ast.walk(f) if isinstance(node, ast.Import | ast.ImportFrom)}


def _module_of(imported: str, modules: Mapping[str, Path]) -> str:
    """The module of the package that ``imported`` (a module, or a name in one) is in; ""
    outside the package."""
    while imported and imported not in modules:
        imported = imported.rpartition(".")[0]
    return imported


def _graph(modules: Mapping[str, Path], root: Path) -> dict[str, dict[str, int]]:
    """module -> {module of the package it imports: line}. ``from a import b`` is an edge to
    ``a.b`` when that is a module, else to ``a``; imports inside functions count. Not counted:
    a package's lazy attributes (imports in its ``__init__``'s ``__getattr__``, PEP 562, as
    ``DefaultSource``, which keeps ``import pyspark_kafka_share`` free of PySpark): they run
    on first access, once both modules are initialised, and a submodule that reads
    ``__version__`` from the package would otherwise close a circle through the whole source."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        lazy = _lazy_attributes(path) if path.name == "__init__.py" else set()
        edges: dict[str, int] = {}
        for node, base, names in _statements(path, root):
            if node.lineno in lazy:
                continue
            for imported in [f"{base}.{n}" if f"{base}.{n}" in modules else base
                             for n in names] or [base]:
                target = _module_of(imported, modules)
                if target and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def _cycles(graph: Mapping[str, Mapping[str, int]]) -> list[str]:
    """One cycle through each group of modules that import each other (a strongly connected
    component of more than one module), as ``a:line -> b:line -> a``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = {stack.pop()}
            while v not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_a_cycle(graph, group) for group in groups]


def _a_cycle(graph: Mapping[str, Mapping[str, int]], group: set[str]) -> str:
    """The shortest cycle from the first module of ``group`` back to it, with the lines."""
    start = min(group)
    came: dict[str, str] = {}  # module -> the one it was reached from (breadth first)
    todo = [start]
    while start not in came:
        reached = []
        for v in todo:
            for w in sorted(graph[v]):
                if w in group and w not in came:
                    came[w] = v
                    reached.append(w)
        todo = reached
    path = [start]
    while len(path) == 1 or path[-1] != start:
        path.append(came[path[-1]])
    path.reverse()
    return " -> ".join(f"{a}:{graph[a][b]}" for a, b in itertools.pairwise(path)) + f" -> {start}"


def _private_imports(modules: Mapping[str, Path], root: Path) -> list[str]:
    """``from <module> import _name`` of a name (not a module) of another module."""
    found: list[str] = []
    for name, path in modules.items():
        for node, base, names in _statements(path, root):
            found += [f"{path.relative_to(root)}:{node.lineno} imports {base}.{n}"
                      for n in names if n.startswith("_") and not n.startswith("__")
                      and base in modules and base != name and f"{base}.{n}" not in modules]
    return found


def test_no_modules_import_each_other() -> None:
    """Directly (A imports B, B imports A) or around a longer circle, at module level or
    inside functions."""
    cycles = _cycles(_graph(_modules(PACKAGE), PACKAGE))
    assert not cycles, "modules that import each other:\n" + "\n".join(cycles)


def test_no_module_imports_a_private_name_of_another() -> None:
    found = _private_imports(_modules(PACKAGE), PACKAGE)
    assert not found, "private names imported from another module:\n" + "\n".join(found)


def test_the_module_checks_see_cycles_and_private_names(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    files = {
        "__init__.py": "def __getattr__(name):\n    from pkg.a import thing\n    return thing\n",
        "a.py": "from pkg import e\nfrom pkg.b import _hidden, shown\n",
        "b.py": "def f():\n    from pkg.c import value\n",
        "c.py": "import pkg.a\nfrom pkg.d import _private_module\n",
        "d/__init__.py": "from . import _private_module\n",
        "d/_private_module.py": "from .. import e\n",
        "e.py": "",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    modules = _modules(root)
    graph = _graph(modules, root)
    assert graph["pkg"] == {}, "a package's lazy attribute is no import"
    assert graph["pkg.a"] == {"pkg.e": 1, "pkg.b": 2}, "from pkg import e is module e"
    assert graph["pkg.d"] == {"pkg.d._private_module": 1}
    assert graph["pkg.d._private_module"] == {"pkg.e": 1}
    assert _cycles(graph) == ["pkg.a:2 -> pkg.b:2 -> pkg.c:1 -> pkg.a"], "b's is in a function"
    assert _private_imports(modules, root) == ["a.py:2 imports pkg.b._hidden"]
