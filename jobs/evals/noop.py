"""An evaluation that does no work: it measures the orchestration path alone (bench/) and lets
executor tests run thousands of jobs in seconds."""
from __future__ import annotations

from pathlib import Path

from common.metrics import MetricSpec
from config.run import JobConfig
from jobs.contract import JobResult, Progress
from jobs.evals import evaluation


@evaluation("noop", title="No-op (scheduling overhead)", metrics={"noop": MetricSpec("no-op", higher_is_better=True)})
def noop(cfg: JobConfig, run_dir: Path, progress: Progress) -> JobResult:
    return JobResult(metrics={"noop": 1.0})
