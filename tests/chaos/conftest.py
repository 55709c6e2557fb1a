"""The chaos tier: one long test under a seeded schedule of faults (``make chaos``).

- Tests marked ``chaos`` run only in a pytest run of their own (``make chaos``,
  ``pytest -m chaos tests/chaos``): in a run that also collects other tests (``make test``)
  they are skipped, as they take minutes and crash their own broker.
- ``chaos_kafka``: a broker of the test's own (it is SIGKILLed and restarted; the session's
  ``kafka`` broker is not touched). Skipped when ``$PYSPARK_KAFKA_SHARE_BOOTSTRAP`` names an
  external broker, which cannot be crashed.
- ``chaos_report``: ``chaos_report("...")`` prints a line now and again in the terminal
  summary, so that CI output shows the seed, the schedule and what each fault did.

The ``spark`` fixture (``local[2, 4]``) comes from ``tests/conftest.py``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from helpers import TierReport, tier_hooks
from pyspark_kafka_share.harness import ENV_BOOTSTRAP, LocalKafka

_REPORT = TierReport("chaos: seed, schedule and what happened")


pytest_collection_modifyitems, pytest_terminal_summary = tier_hooks(
    "chaos", "the chaos test runs in a pytest run of its own: "
    "make chaos (or pytest -m chaos tests/chaos)", _REPORT)


@pytest.fixture
def chaos_report() -> Callable[[str], None]:
    return _REPORT.note


@pytest.fixture
def chaos_kafka() -> Iterator[LocalKafka]:
    if os.environ.get(ENV_BOOTSTRAP):
        pytest.skip(f"${ENV_BOOTSTRAP} names an external broker; the chaos test crashes its own")
    # A short heartbeat and session timeout: members of killed workers leave the group fast.
    with LocalKafka(session_timeout_ms=6_000) as broker:
        yield broker
