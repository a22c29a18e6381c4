"""train: the optimisation of a run (conf/config.yaml, a size's `train` section)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from common.settings import require, setting

if TYPE_CHECKING:
    from config.run import JobConfig


@dataclass(frozen=True)
class TrainConfig:
    """`max_retries`, `checkpoint_every` and `compile` do not change results (not in the run id)."""
    steps: int = setting(gt=0)
    batch_size: int = setting(gt=0)
    lr: float = setting(gt=0)
    min_lr_ratio: float = setting(ge=0, le=1)
    warmup_steps: int = setting(ge=0)
    weight_decay: float = setting(ge=0)
    beta1: float = setting(ge=0, lt=1)
    beta2: float = setting(ge=0, lt=1)
    grad_clip: float = setting(gt=0)
    checkpoint_every: int = setting(gt=0)
    log_every: int = setting(gt=0)
    max_retries: int = setting(ge=0)
    compile: bool = setting()  # torch.compile the model: a compilation per depth

    def check(self, run: JobConfig) -> None:
        require(self.warmup_steps < self.steps,
                f"train.warmup_steps={self.warmup_steps}: must be in [0, train.steps={self.steps})")
