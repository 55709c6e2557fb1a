"""The docs' layout tables against the package's real modules, both ways; the docs index
against the pages.

- ``docs/design.md`` ("## Layout ..."): a row for every module of ``src/pyspark_kafka_share``;
  a package's ``__init__.py`` is covered by a row for the package (``workers/``).
- ``README.md`` ("## Layout"): a row for every top-level module and every top-level package
  (subpackages and their modules are design.md's).

Every path a table lists must exist. The first cell of a row holds its paths in backticks;
a path without ``/`` after another one is in that one's folder (`` `_kafka/arrow.py`,
`produce.py` `` is ``_kafka/arrow.py`` and ``_kafka/produce.py``). A failure names the rows to
add (with the module's docstring, to start the description from) or to remove.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "pyspark_kafka_share"
PREFIX = "src/pyspark_kafka_share/"


@dataclass(frozen=True)
class Table:
    """One layout table: its file, its heading, and what its paths are relative to."""

    doc: str
    heading: str
    base: Path


DESIGN = Table("docs/design.md", "## Layout", PACKAGE)
README = Table("README.md", "## Layout", ROOT)


def _rows(table: Table) -> list[str]:
    """The first cells of the first table under ``table.heading`` (header and rule dropped)."""
    lines = (ROOT / table.doc).read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(table.heading)), None)
    assert start is not None, f"{table.doc}: no heading starting with {table.heading!r}"
    cells: list[str] = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if line.startswith("|"):
            cells.append(line.split("|")[1].strip())
        elif cells:
            break
    assert len(cells) > 2, f"{table.doc}: no table under {table.heading!r}"
    return cells[2:]


def listed_paths(table: Table) -> list[str]:
    """Every path the table lists, as written relative to ``table.base`` (folders end in /)."""
    paths: list[str] = []
    for cell in _rows(table):
        folder = ""
        for token in re.findall(r"`([^`]+)`", cell):
            path = token if "/" in token.rstrip("/") else folder + token
            folder = path[: path.rstrip("/").rfind("/") + 1]
            paths.append(path)
    return paths


def _modules() -> list[str]:
    """Every module of the package relative to it; a package's ``__init__.py`` as ``pkg/``."""
    found: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py" and path.parent != PACKAGE:
            rel = rel.removesuffix("__init__.py")
        found.append(rel)
    return found


def _summary(module: str) -> str:
    """The first line of a module's (or package's) docstring, for the row to add."""
    path = PACKAGE / (module + "__init__.py" if module.endswith("/") else module)
    doc = ast.get_docstring(ast.parse(path.read_text())) or "(no docstring)"
    return doc.splitlines()[0]


def _missing(table: Table, wanted: list[str], rel: str) -> list[str]:
    listed = set(listed_paths(table))
    return [
        f"{table.doc}, the table under {table.heading!r}: no row for `{rel}{m}`; add "
        f"`| \\`{rel}{m}\\` | ... |` ({_summary(m)})"
        for m in wanted if rel + m not in listed
    ]


def _absent(table: Table) -> list[str]:
    return [
        f"{table.doc}, the table under {table.heading!r}: `{p}` does not exist "
        f"(under {table.base.relative_to(ROOT).as_posix() or '.'}/): remove or rename its row"
        for p in listed_paths(table)
        if not (table.base / p).exists() or p.endswith("/") != (table.base / p).is_dir()
    ]


def test_design_lists_every_module() -> None:
    problems = _missing(DESIGN, _modules(), "")
    assert not problems, "\n".join(problems)


def test_readme_lists_every_top_level_module_and_package() -> None:
    top = [m for m in _modules() if "/" not in m.rstrip("/")]
    problems = _missing(README, top, PREFIX)
    assert not problems, "\n".join(problems)


def test_every_listed_path_exists() -> None:
    problems = _absent(DESIGN) + _absent(README)
    assert not problems, "\n".join(problems)


def test_the_index_links_every_page() -> None:
    """docs/README.md, the index (and the docs site's navigation), has a row for every page in
    docs/ (the benchmark pages are reached from benchmarks/README.md)."""
    index = (ROOT / "docs" / "README.md").read_text()
    linked = set(re.findall(r"\]\(([^)#]+)", index))
    pages = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "README.md"]
    missing = [p for p in [*pages, "benchmarks/README.md"] if p not in linked]
    assert not missing, (f"docs/README.md: no row for {missing}; add one to its table where a "
                         "user needs the page, with what it is for")


def test_the_tables_are_read() -> None:
    """The parser finds the rows it checks (the tests above cannot pass on an empty read)."""
    assert f"{PREFIX}errors.py" in listed_paths(README)
    assert {"errors.py", "_kafka/produce.py"} <= set(listed_paths(DESIGN))
    assert "harness/" in _modules() and "__init__.py" in _modules()
