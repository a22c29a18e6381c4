"""tracker: Weights & Biases (conf/tracker/); not part of the run id. The W&B group of a run's
jobs (<sweep>/<family>-<size>) is given to tracking by the sweep that runs them, not kept here:
a run shared by sweeps has one config (orchestrator/tracking.py)."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from common.settings import require, setting

if TYPE_CHECKING:
    from config.family import Derived
    from config.run import JobConfig


@dataclass(frozen=True)
class TrackerConfig:
    enabled: Optional[bool] = setting()       # null: on when the wandb package is importable
    project: str = setting()
    entity: Optional[str] = setting()
    mode: Optional[str] = setting(choices=("offline", "online"))  # null: $WANDB_MODE if set, else offline
    log_every: Optional[int] = setting(gt=0)  # steps between logged rows; null: train.log_every
    init_timeout_s: float = setting(gt=0)
    finish_timeout_s: float = setting(gt=0)

    def derive(self, run: JobConfig) -> Derived:
        return {"log_every": run.train.log_every} if self.log_every is None else {}

    @property
    def every(self) -> int:
        """log_every, derived (never null once composed)."""
        assert self.log_every is not None, "derive() fills tracker.log_every"
        return self.log_every

    def check(self, run: JobConfig) -> None:
        require(not (self.enabled and importlib.util.find_spec("wandb") is None),
                "tracker.enabled=true: the wandb package is not installed; "
                "`pip install wandb==0.31.0` or use tracker=none")
        require(self.every % run.train.log_every == 0,
                f"tracker.log_every={self.log_every}: must be a positive multiple of "
                f"train.log_every={run.train.log_every} (the trainer reports every train.log_every steps)")
