"""The docs site's hooks (mkdocs.yml ``hooks:``): the site is built from docs/ as it reads on
GitHub, with no copy of any page.

- The navigation is the order of docs/README.md's index table (the links of its page column,
  first to last; the API reference last if the table has no row for it); a page linked twice
  appears once.
- The repository's README.md (install, first run, the source's example) becomes the page
  ``start.md``; its links into docs/ point at the site's pages.
- A link that leaves docs/ (``../README.md``, ``../demo/delta_pipeline.py``) points at
  ``start.md`` for the README, and otherwise becomes the repository path in code font.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent
START = "start.md"
API = ("API reference", "api.md")
_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\(([^)\s#]+)(#[^)\s]*)?\)")


def _index_links() -> list[tuple[str, str]]:
    """``(title, docs path)`` of each link in the first column of docs/README.md's table that
    names a page, in order, the README's pages as ``start.md``, each page once."""
    seen: dict[str, str] = {}
    for line in (ROOT / "docs" / "README.md").read_text().splitlines():
        cells = line.split("|")
        if len(cells) < 4 or not line.startswith("|"):
            continue
        for title, target, _anchor in _LINK.findall(cells[2]):
            path = START if target == "../README.md" else target
            seen.setdefault(path, "Getting started" if path == START else title.replace("`", ""))
    return [(title, path) for path, title in seen.items()]


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    nav: list[Any] = [{"Home": "README.md"}]
    links = _index_links()
    nav += [{title: path} for title, path in links]
    if API[1] not in {path for _, path in links}:
        nav.append({API[0]: API[1]})
    config.nav = nav
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, START, content=(ROOT / "README.md").read_text()))
    return files


def _rewrite(page_dir: str, repo_dir: str, markdown: str) -> str:
    """Links of a page in ``page_dir`` (under docs/) whose source lives in ``repo_dir`` (of the
    repository): those into docs/ relative to the page, the README to ``start.md``, the rest
    to the repository path in code font."""

    def one(match: re.Match[str]) -> str:
        text, target, anchor = match.group(1), match.group(2), match.group(3) or ""
        if "://" in target or target.startswith(("mailto:", "/")):
            return match.group(0)
        path = posixpath.normpath(posixpath.join(repo_dir, target))
        if path == "README.md":
            path = "docs/" + START
        if path.startswith("docs/"):
            return f"[{text}]({posixpath.relpath(path[5:], page_dir or '.')}{anchor})"
        return text if f"`{path}`" in text else f"{text} (`{path}`)"

    return _LINK.sub(one, markdown)


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    src = page.file.src_uri
    if src == START:
        return _rewrite("", "", markdown)
    page_dir = posixpath.dirname(src)
    return _rewrite(page_dir, posixpath.join("docs", page_dir), markdown)
