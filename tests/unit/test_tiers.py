"""The version tiers select by pytest markers; each still selects what it selected when it
selected by name substrings (tests/tiers/<key>.txt, recorded at 16b8a0a).

Each tier's pytest invocations are read from the Makefile as make runs them
(:func:`tests.tiers.tier_invocations`) and collected (``pytest --collect-only``, no broker, no
Spark): a test dropped from a tier, by a lost marker or a rename, fails here.
"""

from __future__ import annotations

import pytest

from tests.tiers import TIERS, Invocation, collect, tier_invocations

INVOCATIONS = tier_invocations()


def _recorded(invocation: Invocation) -> list[str]:
    lines = invocation.recorded.read_text().splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def test_every_tier_invocation_has_a_record_and_every_record_a_tier() -> None:
    keys = {i.key for i in INVOCATIONS}
    assert {p.stem for p in TIERS.glob("*.txt")} == keys
    # The tiers select by markers now: no pytest process of theirs takes -k.
    assert {i.option for i in INVOCATIONS} == {"-m"}, [i.key for i in INVOCATIONS]


@pytest.mark.parametrize("invocation", INVOCATIONS, ids=lambda i: i.key)
def test_each_tier_still_selects_its_recorded_tests(invocation: Invocation) -> None:
    selected = set(collect(invocation))
    missing = [i for i in _recorded(invocation) if i not in selected]
    assert not missing, (
        f"make {invocation.target} (PySpark {invocation.spark}, Kafka {invocation.kafka}, "
        f"{invocation.option} {invocation.expression!r}) no longer selects {missing}. A renamed "
        f"or moved test: update {invocation.recorded.relative_to(TIERS.parents[1])}; a test "
        f"that left the tier: give it back its marker (pyproject.toml lists them).")
