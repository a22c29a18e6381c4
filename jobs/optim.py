"""The training recipe: the learning-rate schedule and the optimizer over its settings (`train`
in conf/, config/train.py). The training loop (jobs/train.py) and LIDAS growth
(jobs/families/lidas.py) use it."""
from __future__ import annotations

import math

import torch
from torch import nn

from config.train import TrainConfig


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


