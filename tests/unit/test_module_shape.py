"""The package's modules stay readable: none over :data:`MAX_LINES` lines.

Import cycles and private names imported from another module are ``test_layers.py``'s.
"""

from __future__ import annotations

from pathlib import Path

import pyspark_kafka_share

PACKAGE = Path(pyspark_kafka_share.__file__).parent
MAX_LINES = 600
"""A module longer than this is split by responsibility (issue 34)."""


def _lengths() -> dict[str, int]:
    return {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines())
            for p in sorted(PACKAGE.rglob("*.py"))}


def test_no_module_is_over_the_size_limit() -> None:
    long = {path: n for path, n in _lengths().items() if n > MAX_LINES}
    assert long == {}, f"split these modules by responsibility (over {MAX_LINES} lines)"


def test_the_check_reads_every_module() -> None:
    """A check that sees no module cannot fail: it reads the package's modules, lines and all."""
    lengths = _lengths()
    assert lengths["errors.py"] > 100 and "workers/api.py" in lengths
