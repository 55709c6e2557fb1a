"""The Connect tier: the source and the queue workers driven from a Spark Connect client.

The ``connect_server`` (a local Spark Connect server: a JVM of its own, from pyspark's own jars,
``local[2, 4]``) and its ``connect_spark`` session come from :mod:`tests.fixtures.connect`; the
``kafka`` broker and the ``journal`` from the other fixture modules. The client process runs no
JVM, as on Databricks serverless or a notebook service: what passes here passes from a remote
client.

- Tests marked ``connect`` (every test using the Connect fixtures is) run only in a pytest run
  of their own (``make test-connect``, ``pytest -m connect tests/connect``): in a run that also
  collects other tests (``make test``) they are skipped, to keep ``make test`` within its time.
- ``connect_report``: ``connect_report("...")`` prints a line now and again in the terminal
  summary, so that CI output shows what the tier did (killed workers, what the client saw).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.helpers import TierReport, tier_hooks

_REPORT = TierReport("Connect tier: what the client saw")


pytest_collection_modifyitems, pytest_terminal_summary = tier_hooks(
    "connect", "the Connect tier runs in a pytest run of its own: "
    "make test-connect (or pytest -m connect tests/connect)", _REPORT)


@pytest.fixture
def connect_report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """``connect_report("...")`` prints a line now and in the terminal summary."""
    def note(line: str) -> None:
        _REPORT.note(f"[{request.node.name}] {line}")

    return note
