"""The cluster tier: the source and the queue workers on a real Spark standalone cluster.

- ``evidence``: lines (speculative attempts, killed executors) printed at once and again in the
  terminal summary, so that CI output shows what the tier did.

The ``kafka`` broker, the ``cluster`` and its ``cluster_spark`` session, and the ``journal``
(a local directory, which every executor of this one-machine cluster sees, and ``s3://`` on
LocalS3) come from :mod:`tests.fixtures`. A process holds one SparkContext, so these tests run
in a pytest process of their own (``make test-cluster``); in a run that also collects other
tests they are skipped.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.helpers import TierReport, tier_hooks

_EVIDENCE = TierReport("cluster tier: what really happened")


pytest_collection_modifyitems, pytest_terminal_summary = tier_hooks(
    "cluster", "the cluster tier needs a pytest process of its own "
    "(one SparkContext per process): make test-cluster", _EVIDENCE)


@pytest.fixture
def evidence(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """``evidence("...")`` prints a line now and in the terminal summary."""
    def note(line: str) -> None:
        _EVIDENCE.note(f"[{request.node.name}] {line}")

    return note
