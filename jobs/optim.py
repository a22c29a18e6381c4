"""The training recipe: its settings (`train` in conf/), the learning-rate schedule and the
optimizer. The training loop (jobs/train.py) and LIDAS growth (jobs/families/lidas.py) use it."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from common.settings import require, setting


@dataclass
class TrainConfig:
    """The optimisation of a run (conf/config.yaml, a size's `train` section). `max_retries`,
    `checkpoint_every` and `compile` do not change results (not in the run id)."""
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

    def check(self, run: Any) -> None:
        require(self.warmup_steps < self.steps,
                f"train.warmup_steps={self.warmup_steps}: must be in [0, train.steps={self.steps})")


def learning_rate(step: int, train_cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine from lr down to lr * min_lr_ratio at the last step."""
    peak, warmup, steps = train_cfg.lr, train_cfg.warmup_steps, train_cfg.steps
    if step < warmup:
        return peak * (step + 1) / warmup
    floor = peak * train_cfg.min_lr_ratio
    progress = (step + 1 - warmup) / max(1, steps - warmup)
    return floor + 0.5 * (peak - floor) * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: nn.Module, train_cfg: TrainConfig, fused: bool = True) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not norms), params in model order.

    The order matters: it is how optimizer state is matched to parameters when a checkpoint
    is loaded into a freshly built model. `fused`: one kernel updates every parameter (on CPU as
    on CUDA) rather than a few ops per parameter; the per-parameter loop is for reference.
    """
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": train_cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=train_cfg.lr, betas=(train_cfg.beta1, train_cfg.beta2), eps=1e-8,
                             fused=fused)


