"""An evaluation that lives outside the project, registered the way docs/extending.md shows:
one file, named in $ORCHESTRATOR_PLUGINS. It scores the final model's embedding norm."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.metrics import MetricSpec
from common.settings import setting
from jobs.backends import load_model
from jobs.contract import JobResult, Progress
from jobs.evals import evaluation


@dataclass
class WeightNormSettings:
    """eval.weight_norm: its defaults live here (conf/ does not know this evaluation)."""
    scale: float = setting(1.0, gt=0)


@evaluation("weight_norm", title="Weight norm", settings=WeightNormSettings, data=("regbench", "arith"), metrics={
    "embedding_norm": MetricSpec("embedding norm (scaled)", higher_is_better=False)})
def weight_norm(cfg: Any, run_dir: Path, progress: Progress) -> JobResult:
    model = load_model(cfg, run_dir)
    return JobResult(metrics={"embedding_norm": cfg.eval.weight_norm.scale * float(model.embed.weight.norm())})
