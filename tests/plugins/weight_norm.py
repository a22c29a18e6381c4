"""An evaluation that lives outside the project, registered the way docs/extending.md shows:
one file, named in $ORCHESTRATOR_PLUGINS, declaring its config (settings and data kinds) and its
job. It scores the final model's embedding norm."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common.metrics import MetricSpec
from common.settings import setting
from config.evals import declare_evaluation, eval_settings
from config.run import JobConfig
from jobs.backends import load_model
from jobs.contract import JobResult, Progress
from jobs.evals import evaluation


@dataclass(frozen=True)
class WeightNormSettings:
    """eval.weight_norm: its defaults live here (conf/ does not know this evaluation)."""
    scale: float = setting(1.0, gt=0)


declare_evaluation("weight_norm", settings=WeightNormSettings, data=("regbench", "arith"))


@evaluation("weight_norm", title="Weight norm", metrics={
    "embedding_norm": MetricSpec("embedding norm (scaled)", higher_is_better=False)})
def weight_norm(cfg: JobConfig, run_dir: Path, progress: Progress) -> JobResult:
    model = load_model(cfg, run_dir)
    scale = eval_settings(cfg.eval, "weight_norm", WeightNormSettings).scale
    return JobResult(metrics={"embedding_norm": scale * float(model.embed.weight.norm())})
