"""An evaluation that does no work: it measures the orchestration path alone (bench/) and lets
executor tests run thousands of jobs in seconds."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from common.metrics import MetricSpec
from jobs.contract import JobResult, Progress
from jobs.evals import evaluation

if TYPE_CHECKING:  # type hints only: jobs.config imports the packages that define the sections
    from jobs.config import JobConfig


@evaluation("noop", title="No-op (scheduling overhead)", metrics={"noop": MetricSpec("no-op", higher_is_better=True)},
            data=())
def noop(cfg: JobConfig, run_dir: Path, progress: Progress) -> JobResult:
    return JobResult(metrics={"noop": 1.0})
