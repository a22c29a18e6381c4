"""An evaluation whose result is planted by family and seed, so that a real adaptive sweep's
statistics have a known outcome: lidas is far better than dense from the first look, looped is
better too but needs more seeds to show it (tests/e2e/test_adaptive.py)."""
from __future__ import annotations

from pathlib import Path

from common.metrics import MetricSpec
from config.evals import declare_evaluation
from config.run import JobConfig
from jobs.contract import JobResult, Progress
from jobs.evals import evaluation

LOOPED = [2.4, 3.1, 1.5, 2.6, 2.2, 2.5, 2.7, 2.3]  # differences to dense, seed by seed
LIDAS = [0.1, -0.2, 0.05, 0.15, -0.1, 0.0, 0.2, -0.05]  # lidas is 10 better, give or take these
NOISE = [0.01, -0.02, 0.015, 0.0, -0.01, 0.02, -0.015, 0.005]


declare_evaluation("planted", data=())


@evaluation("planted", title="Planted effect",
            metrics={"planted_score": MetricSpec("planted score", higher_is_better=True)})
def planted(cfg: JobConfig, run_dir: Path, progress: Progress) -> JobResult:
    base = {"dense": 0.0, "lidas": 10.0 + LIDAS[cfg.seed], "looped": LOOPED[cfg.seed]}[cfg.family.name]
    return JobResult(metrics={"planted_score": base + NOISE[cfg.seed]})
