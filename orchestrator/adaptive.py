"""Adaptive seeding (statistics.md (f)): seeds added in a pre-declared schedule of looks until the
comparison is decided. Off while `adaptive.metric` is null; the Sweep runs the looks
(orchestrator/sweep.py), analysis.sequential.next_seeds decides at each."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from common.settings import require, setting
from jobs.registry import get_job


@dataclass
class AdaptiveConfig:
    metric: Optional[str] = setting()
    max_seeds: int = setting(ge=2)
    looks: list[int] = setting(ge=2, nonempty=True)
    alpha: float = setting(gt=0, lt=1)
    delta_min: float = setting(gt=0)
    baseline: str = setting()

    @property
    def schedule(self) -> list[int]:
        """The declared looks up to max_seeds, ending at max_seeds (S_max)."""
        return [n for n in self.looks if n < self.max_seeds] + [self.max_seeds]

    def check(self, run: Any) -> None:
        if self.metric is None:
            return
        recorded = sorted(set().union(*(get_job(job).outcomes() for job in ["train", *run.eval.jobs])))
        require(self.metric in recorded, f"adaptive.metric={self.metric}: not allowed; choose one of: "
                f"{', '.join(recorded)} (the metrics of train and eval.jobs)")
        looks = self.schedule
        require(looks[0] >= 2 and all(x < y for x, y in zip(looks, looks[1:])),
                f"adaptive.looks={self.looks}: must be increasing seed counts from 2 up to "
                f"adaptive.max_seeds={self.max_seeds}")
