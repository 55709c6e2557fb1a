"""The package's modules stay readable: none over :data:`MAX_LINES` lines, no module imports
another's private name (``from .x import _name``), and no two modules of the kernel
(``_kafka``) import each other.

Like ``test_layers.py`` this walks every module's imports, function-level ones too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pyspark_kafka_share

PACKAGE = Path(pyspark_kafka_share.__file__).parent
NAME = "pyspark_kafka_share"
MAX_LINES = 600
"""A module longer than this is split by responsibility (issue 34)."""


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` (``pyspark_kafka_share.a.b``) names a module or package of ours."""
    rel = Path(*dotted.split("."))
    return (PACKAGE.parent / rel).with_suffix(".py").is_file() or \
        (PACKAGE.parent / rel / "__init__.py").is_file()


def _from_imports(path: Path) -> Iterator[tuple[int, str, str]]:
    """``(line, module, name)`` of every ``from module import name`` of the package in
    ``path``, relative imports resolved."""
    package = _module_name(path) if path.name == "__init__.py" else \
        _module_name(path).rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = node.module or ""
        if node.level:
            parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            base = f"{parent}.{base}" if base else parent
        if base == NAME or base.startswith(f"{NAME}."):
            yield from ((node.lineno, base, a.name) for a in node.names)


def _imported_modules(path: Path) -> set[str]:
    """The package's modules that ``path`` imports (``import m``, ``from m import x``, and
    ``from package import module``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith(f"{NAME}."))
    for _, base, name in _from_imports(path):
        out.add(f"{base}.{name}" if _is_module(f"{base}.{name}") else base)
    return out


def test_no_module_is_over_the_size_limit() -> None:
    long = {str(p.relative_to(PACKAGE)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these modules by responsibility (over {MAX_LINES} lines)"


def test_no_module_imports_a_private_name_of_another() -> None:
    found = [f"{p.relative_to(PACKAGE)}:{line} imports {name} from {base}"
             for p in _modules() for line, base, name in _from_imports(p)
             if name.startswith("_") and not name.startswith("__")
             and not _is_module(f"{base}.{name}")]  # a private module is the package's own
    assert found == []


def test_no_two_kernel_modules_import_each_other() -> None:
    kernel = sorted((PACKAGE / "_kafka").rglob("*.py"))
    imports = {_module_name(p): _imported_modules(p) for p in kernel}
    both = sorted(f"{a} <-> {b}" for a, deps in imports.items() for b in deps
                  if a < b and a in imports.get(b, set()))
    assert both == []


def test_the_checks_see_what_they_look_for(tmp_path: Path) -> None:
    """The walkers find a private name and a module import (a check that cannot fail is none)."""
    found = list(_from_imports(PACKAGE / "harness" / "broker.py"))
    assert any(name == "_process" and base == f"{NAME}.harness" for _, base, name in found)
    assert _is_module(f"{NAME}.harness._process") and not _is_module(f"{NAME}.errors.OptionError")
    assert f"{NAME}.harness._process" in _imported_modules(PACKAGE / "harness" / "broker.py")
    assert f"{NAME}.errors" in _imported_modules(PACKAGE / "admin.py")
