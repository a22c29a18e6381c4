"""adaptive: adaptive seeding (statistics.md (f)): seeds added in a pre-declared schedule of
looks until the comparison is decided. Off while `adaptive.metric` is null; the Sweep runs the
looks (orchestrator/sweep.py), analysis.sequential.next_seeds decides at each. That the metric is one the
jobs record is checked where the jobs are known (orchestrator/config.py).

`adaptive.seed_sd` serves every sweep, adaptive or not: the seed noise the dry run plans with where
no pilot (an earlier run of the same sweep) gives one, per metric (statistics.md, "Before a sweep")."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from common.settings import require, setting

if TYPE_CHECKING:
    from config.run import JobConfig


@dataclass(frozen=True)
class AdaptiveConfig:
    metric: Optional[str] = setting()
    max_seeds: int = setting(ge=2)
    looks: list[int] = setting(ge=2, nonempty=True)
    alpha: float = setting(gt=0, lt=1)
    delta_min: float = setting(gt=0)
    baseline: str = setting()
    # metric -> the seed sd of a comparison's paired difference (candidate - baseline), for planning
    seed_sd: dict[str, float] = setting(factory=dict)

    @property
    def schedule(self) -> list[int]:
        """The declared looks up to max_seeds, ending at max_seeds (S_max)."""
        return [n for n in self.looks if n < self.max_seeds] + [self.max_seeds]

    def check(self, run: JobConfig) -> None:
        for metric, sd in self.seed_sd.items():
            require(isinstance(sd, (int, float)) and math.isfinite(sd) and sd > 0,
                    f"adaptive.seed_sd.{metric}={sd}: must be a finite number > 0 (the seed sd of the difference"
                    f" candidate - baseline); leave the metric out where it is unknown")
        if self.metric is None:
            return
        looks = self.schedule
        require(looks[0] >= 2 and all(x < y for x, y in zip(looks, looks[1:])),
                f"adaptive.looks={self.looks}: must be increasing seed counts from 2 up to "
                f"adaptive.max_seeds={self.max_seeds}")
