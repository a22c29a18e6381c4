"""An evaluation that does no work: it measures the orchestration path alone (bench/) and lets
scheduler tests run thousands of jobs in seconds."""
from pathlib import Path

from ..registry import JobResult, Progress, evaluation


@evaluation("noop", metrics=("noop",), data=("regbench", "arith"))
def noop(cfg: dict, run_dir: Path, progress: Progress) -> JobResult:
    return JobResult(metrics={"noop": 1.0}, higher_is_better={"noop": True})
