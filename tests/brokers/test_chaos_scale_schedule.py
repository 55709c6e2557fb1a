"""The chaos-scale schedule is a pure function of the seed (pure unit tests: they run in
``make unit``; the run itself is ``make chaos-scale``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.brokers.chaos_scale import (
    CLUSTER_KINDS,
    EXECUTOR_KILL,
    LEADER_MOVE,
    NODE_CRASH,
    ROLLING_UPGRADE,
    SCALE_KINDS,
    describe,
    scale_schedule,
    spark_mode,
    upgrade_target,
)
from tests.chaos.chaos_schedule import KINDS, ChaosConfig, make_schedule


def test_the_same_seed_gives_the_same_schedule_and_every_kind_appears() -> None:
    for seed in range(30):
        config = ChaosConfig(seed=seed, faults=40)
        schedule = scale_schedule(config)
        assert schedule == scale_schedule(ChaosConfig(seed=seed, faults=40))
        assert {f.kind for f in schedule} == set(SCALE_KINDS)
        assert [f.at_s for f in schedule] == sorted(f.at_s for f in schedule)
        for f in schedule:
            if f.kind == LEADER_MOVE:
                assert 0 <= f.victim < config.topic_partitions, f
            elif f.kind in CLUSTER_KINDS:
                assert 1 <= f.victim <= 3, f
                low, high = (1.0, 6.0) if f.kind == NODE_CRASH else (3.0, 15.0)
                assert low <= f.down_s <= high, f
    assert scale_schedule(ChaosConfig(seed=1, faults=40)) != \
        scale_schedule(replace(ChaosConfig(seed=1, faults=40), seed=2))


def test_the_chaos_tests_published_schedules_are_unchanged_by_the_kinds_parameter() -> None:
    """Recorded with make_schedule before it took ``kinds_used``: published seeds replay."""
    long = make_schedule(ChaosConfig(seed=2014647293, faults=24))  # make chaos-long's seed
    assert [(f.kind, f.at_s) for f in long][:5] == [
        ("worker-sigkill", 16.6), ("worker-sigkill", 30.0), ("worker-exit", 36.1),
        ("lock-expiry", 50.0), ("broker-crash", 55.5)]
    few = make_schedule(ChaosConfig(seed=7, faults=3), KINDS)  # fewer faults than kinds
    assert [(f.kind, f.at_s) for f in few] == [
        ("broker-crash", 18.9), ("worker-exit", 28.2), ("query-restart", 40.5)]


def test_a_rolling_upgrade_joins_the_schedule_once_at_its_middle() -> None:
    config = ChaosConfig(seed=5, faults=40)
    plain = scale_schedule(config)
    upgraded = scale_schedule(config, upgrade_to="4.4.0")
    assert [f for f in upgraded if f.kind != ROLLING_UPGRADE] == plain  # the rest unchanged
    (upgrade,) = [f for f in upgraded if f.kind == ROLLING_UPGRADE]
    assert upgraded.index(upgrade) == 20 and upgrade.at_s == plain[20].at_s
    assert upgrade.index == 40  # an index of its own: the drawn faults keep theirs
    assert upgrade_target({"CHAOS_UPGRADE_TO": "4.4.0"}) == "4.4.0"
    assert upgrade_target({}) is None
    assert scale_schedule(ChaosConfig(seed=5, faults=0), upgrade_to="4.4.0") == []


def test_executor_kills_join_the_schedule_with_spark_as_a_cluster() -> None:
    config = ChaosConfig(seed=9, faults=40)
    schedule = scale_schedule(config, kinds=(*SCALE_KINDS, EXECUTOR_KILL))
    kills = [f for f in schedule if f.kind == EXECUTOR_KILL]
    assert kills and all(0 <= f.victim < 2 for f in kills)  # the cluster's two workers
    assert schedule == scale_schedule(config, kinds=(*SCALE_KINDS, EXECUTOR_KILL))
    assert all("executor" in describe(f) for f in kills)
    assert spark_mode({}) == "local" and spark_mode({"CHAOS_SPARK": "cluster"}) == "cluster"
    with pytest.raises(ValueError, match="CHAOS_SPARK"):
        spark_mode({"CHAOS_SPARK": "yarn"})
