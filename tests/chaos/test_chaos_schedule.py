"""The chaos schedule is a pure function of the seed (pure unit tests: they run in ``make
test`` and ``make unit``; the chaos run itself is ``make chaos``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.chaos.chaos_schedule import (
    KINDS,
    ChaosConfig,
    chaos_clients,
    make_schedule,
    worker_client,
)


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    config = ChaosConfig(seed=42, faults=20)
    assert make_schedule(config) == make_schedule(ChaosConfig(seed=42, faults=20))
    assert make_schedule(config) != make_schedule(replace(config, seed=43))


@pytest.mark.parametrize("faults", [5, 10, 25])
def test_every_kind_appears_and_faults_come_in_time_order(faults: int) -> None:
    for seed in range(50):
        config = ChaosConfig(seed=seed, faults=faults)
        schedule = make_schedule(config)
        assert len(schedule) == faults
        assert {f.kind for f in schedule} == set(KINDS)
        times = [f.at_s for f in schedule]
        assert times == sorted(times)
        assert config.warmup_s <= times[0] and times[-1] < config.chaos_s
        assert all(0 <= f.part < config.tasks for f in schedule)


def test_fewer_faults_than_kinds_are_distinct_kinds() -> None:
    schedule = make_schedule(ChaosConfig(seed=7, faults=3))
    assert len({f.kind for f in schedule}) == 3


def test_sizes_come_from_the_environment() -> None:
    config = ChaosConfig.from_env({"CHAOS_SEED": "5", "CHAOS_RECORDS": "100000",
                                   "CHAOS_FAULTS": "20"})
    assert (config.seed, config.records, config.faults) == (5, 100_000, 20)
    assert config.rate == pytest.approx(100_000 / config.chaos_s)
    assert ChaosConfig.from_env({}).seed > 0  # random when not given
    with pytest.raises(ValueError, match="bad chaos size"):
        ChaosConfig.from_env({"CHAOS_RECORDS": "0"})


def test_the_workers_client_comes_from_the_environment() -> None:
    assert worker_client({}) == "librdkafka"
    assert worker_client({"CHAOS_CLIENT": "native"}) == "native"
    with pytest.raises(ValueError, match="CHAOS_CLIENT='java': use one of librdkafka, native"):
        worker_client({"CHAOS_CLIENT": "java"})
    assert chaos_clients({}) == ("librdkafka", "native")  # make chaos in CI: both
    assert chaos_clients({"CHAOS_CLIENT": "native"}) == ("native",)
    with pytest.raises(ValueError, match="CHAOS_CLIENT='java'"):
        chaos_clients({"CHAOS_CLIENT": "java"})
