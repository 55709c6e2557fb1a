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
from typing import Any

import pytest

from pyspark_kafka_share.localkafka import ENV_BOOTSTRAP, LocalKafka

_REPORT: list[str] = []


@pytest.hookimpl(trylast=True)  # after -m/-k deselection
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    chaos = [i for i in items if i.get_closest_marker("chaos") is not None]
    if chaos and len(chaos) < len(items):
        skip = pytest.mark.skip(reason="the chaos test runs in a pytest run of its own: "
                                       "make chaos (or pytest -m chaos tests/chaos)")
        for item in chaos:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _REPORT:
        terminalreporter.section("chaos: seed, schedule and what happened")
        for line in _REPORT:
            terminalreporter.write_line(line)


@pytest.fixture
def chaos_report() -> Callable[[str], None]:
    def note(line: str) -> None:
        _REPORT.append(line)
        print(line, flush=True)

    return note


@pytest.fixture
def chaos_kafka() -> Iterator[LocalKafka]:
    if os.environ.get(ENV_BOOTSTRAP):
        pytest.skip(f"${ENV_BOOTSTRAP} names an external broker; the chaos test crashes its own")
    # A short heartbeat and session timeout: members of killed workers leave the group fast.
    with LocalKafka(session_timeout_ms=6_000) as broker:
        yield broker
