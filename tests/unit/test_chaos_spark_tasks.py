"""The chaos runs' count of failed task attempts (``tests/chaos/chaos_harness.SparkTasks``)
keeps a finished job's failures after Spark's status tracker has forgotten the job (it keeps
``spark.ui.retainedJobs``, 1,000): a long run's count never falls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from tests.chaos.chaos_harness import SparkTasks


@dataclass
class _Job:
    status: str
    stageIds: list[int]


@dataclass
class _Stage:
    numFailedTasks: int


@dataclass
class _Tracker:
    jobs: dict[int, _Job] = field(default_factory=dict)
    stages: dict[int, _Stage] = field(default_factory=dict)

    def getJobIdsForGroup(self, group: str) -> list[int]:
        return list(self.jobs)

    def getJobInfo(self, job_id: int) -> _Job | None:
        return self.jobs.get(job_id)

    def getStageInfo(self, stage_id: int) -> _Stage | None:
        return self.stages.get(stage_id)


def _tasks(tracker: _Tracker) -> SparkTasks:
    tasks = SparkTasks.__new__(SparkTasks)
    tasks.tracker = cast(Any, tracker)
    tasks.run_ids = ["run-1"]
    tasks._done = {}
    return tasks


def test_a_forgotten_finished_job_still_counts() -> None:
    tracker = _Tracker({1: _Job("SUCCEEDED", [10]), 2: _Job("RUNNING", [20])},
                       {10: _Stage(2), 20: _Stage(1)})
    tasks = _tasks(tracker)
    assert tasks.failed() == 3
    del tracker.jobs[1]  # the tracker retains only the newest jobs
    assert tasks.failed() == 3
    tracker.stages[20].numFailedTasks = 4  # a running job's count is read afresh
    assert tasks.failed() == 6
