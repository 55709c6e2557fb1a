"""The chaos tier: one long test under a seeded schedule of faults (``make chaos``).

- Tests marked ``chaos`` run only in a pytest run of their own (``make chaos``,
  ``pytest -m chaos tests/chaos``): in a run that also collects other tests (``make test``)
  they are skipped, as they take minutes and crash their own broker.
- ``chaos_report``: ``chaos_report("...")`` prints a line now and again in the terminal
  summary, so that CI output shows the seed, the schedule and what each fault did.

The ``chaos_kafka`` broker (the test's own) and the ``spark`` fixture (``local[2, 4]``) come
from :mod:`tests.fixtures`.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.helpers import TierReport, tier_hooks

_REPORT = TierReport("chaos: seed, schedule and what happened")


pytest_collection_modifyitems, pytest_terminal_summary = tier_hooks(
    "chaos", "the chaos test runs in a pytest run of its own: "
    "make chaos (or pytest -m chaos tests/chaos)", _REPORT)


@pytest.fixture
def chaos_report() -> Callable[[str], None]:
    return _REPORT.note
