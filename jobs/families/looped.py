"""looped: a prelude, a block of k unique layers applied `loops` times, a coda (config/family.py
`LoopedConfig`)."""
from __future__ import annotations

from typing import Optional

from config.family import LoopedConfig
from config.model import ModelConfig
from jobs.families import FAMILIES, Family


@FAMILIES.register("looped")
class Looped(Family[LoopedConfig]):
    def layer_plan(self, model: ModelConfig, ancestors: Optional[list[int]] = None) -> tuple[int, list[int]]:
        prelude, block, loops, coda = self.config.layers
        plan = (list(range(prelude)) + list(range(prelude, prelude + block)) * loops
                + list(range(prelude + block, prelude + block + coda)))
        return prelude + block + coda, plan
