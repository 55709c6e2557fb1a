"""The brokers tier: the source and the workers on a three-broker KRaft cluster under broker
kills and network faults (``make test-brokers``, a pytest process of its own).

- ``fault_report``: ``fault_report("...")`` prints a line now and again in the terminal
  summary (which node was killed or blackholed, where the leader or coordinator moved, the
  proxy's byte counters), so that CI output shows what each fault did.

The cluster, its Toxiproxy and the ``spark`` session come from :mod:`tests.fixtures`.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.helpers import TierReport, tier_hooks

_REPORT = TierReport("brokers tier: faults and where leaders and coordinators moved")


pytest_collection_modifyitems, pytest_terminal_summary = tier_hooks(
    "brokers", "the brokers tier runs a three-broker cluster in a pytest process of its own: "
    "make test-brokers", _REPORT)


@pytest.fixture
def fault_report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    def note(line: str) -> None:
        _REPORT.note(f"[{request.node.name}] {line}")

    return note
