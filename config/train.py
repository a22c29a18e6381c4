"""train: the optimisation of a run (conf/config.yaml, a size's `train` section)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from common.settings import require, setting

if TYPE_CHECKING:
    from config.run import JobConfig


CPU_CAPABILITIES = ("default", "avx2", "avx512", "sve256", "vsx", "zvector")  # what torch reads; x86: the first three


@dataclass(frozen=True)
class TrainConfig:
    """`max_retries`, `checkpoint_every`, `snapshots`, `compile` and `cpu_capability` are not in
    the run id (snapshots only keep copies of the weights; the last two move only the last bits, as
    the thread count does)."""
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
    # ATen's CPU kernels for every job of the run (ATEN_CPU_CAPABILITY), the same on machines of
    # different kinds; null: each machine's own (jobs/environment.py, docs/reliability.md)
    cpu_capability: Optional[str] = setting(None, choices=CPU_CAPABILITIES)
    # Weights kept at this many evenly spaced steps (the last one the final step), and by a growing
    # family right after each growth (jobs/train.py `snapshot_steps`); 0: none. The evaluations of
    # the mechanism over training read them (jobs/evals/mechanism.py).
    snapshots: int = setting(4, ge=0)

    def check(self, run: JobConfig) -> None:
        require(self.warmup_steps < self.steps,
                f"train.warmup_steps={self.warmup_steps}: must be in [0, train.steps={self.steps})")
