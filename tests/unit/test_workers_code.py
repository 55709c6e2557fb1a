"""The workers' code keeps results typed (issue #34): a grep of ``src/.../workers/`` for the
in-band signals the loop's exactly-once settlement once used, which the settlers replaced by
typed results (committed / refused with reasons / not committed):

- identity sentinels: a module constant compared with ``is`` (``failed is _NOT_COMMITTED``);
- negative item indices: the marker and the tombstones at ``-1``/``-2 - i`` in the records'
  index space, filtered out again with ``if i >= 0``;
- ``type: ignore`` (an Optional attribute used as if always set).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import pyspark_kafka_share

WORKERS = Path(pyspark_kafka_share.__file__).parent / "workers"

BANNED = {
    "identity sentinel": re.compile(r"\bis(?: not)? _*[A-Z][A-Z0-9]*_[A-Z0-9_]*\b"
                                    r"|_NOT_COMMITTED"),
    "negative item index": re.compile(r"\bif \w+ >= 0\b|\(-[12],|-2 - \w"),
    "type: ignore": re.compile(r"type:\s*ignore"),
}


def _hits(text: str) -> list[str]:
    return [f"{what}: {line.strip()}" for line in text.splitlines()
            for what, pattern in BANNED.items() if pattern.search(line)]


def test_the_workers_have_no_sentinels_negative_indices_or_type_ignores() -> None:
    files = sorted(WORKERS.rglob("*.py"))
    assert len(files) > 5 and any(f.parent.name == "exactly_once" for f in files)
    found = [f"{f.relative_to(WORKERS)}: {hit}" for f in files for hit in _hits(f.read_text())]
    assert found == []


@pytest.mark.parametrize("line", [
    "            if failed is _NOT_COMMITTED:",
    "_NOT_COMMITTED: dict[int, str] = {-99: 'not committed'}",
    "        if result is not _NO_RESULT:",
    "            failed = {i: err for i, err in failed.items() if i >= 0}  # not the marker's",
    "            marker = [(-1, eos.txn.topic, key, value, [])]",
    "        tombstones = [(-2 - i, eos.txn.topic, k, None, [])",
    "            self.eos.confirmed(key, settled.confirmed)  # type: ignore[union-attr]",
])
def test_the_grep_finds_what_it_bans(line: str) -> None:
    assert _hits(line)


@pytest.mark.parametrize("line", [
    "            if outcome is Outcome.ACCEPT:",
    "        if v is None:",
    "        if isinstance(result, NotCommitted):",
    "        refused = Refused({it.index: err for it, err in zip(items, errs)})",
    "        return [x for i, x in enumerate(group) if i not in failed]",
])
def test_the_grep_passes_typed_code(line: str) -> None:
    assert _hits(line) == []
