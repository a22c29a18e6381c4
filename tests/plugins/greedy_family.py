"""A model family from outside the project, its config class and its behaviour in one file (as
docs/extending.md shows), whose derive reaches into another section: planning refuses it
(tests/unit/test_config.py). `family.reach` says how it tries: assigning to the model section, or
returning a model field as if it were its own."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from common.settings import setting
from config.family import FAMILY_CONFIGS, Derived, FamilyConfig
from config.model import ModelConfig
from config.run import JobConfig
from jobs.families import FAMILIES, Family


@FAMILY_CONFIGS.register("greedy")
@dataclass(frozen=True)
class GreedyConfig(FamilyConfig):
    reach: str = setting("assign", choices=("assign", "return"))

    def derive(self, run: JobConfig) -> Derived:
        if self.reach == "assign":
            run.model.n_layers = 2  # type: ignore[misc]  # another section: refused
        return {"n_layers": 2}  # not a field of this section: refused


@FAMILIES.register("greedy")
class Greedy(Family[GreedyConfig]):
    def layer_plan(self, model: ModelConfig, ancestors: Optional[list[int]] = None) -> tuple[int, list[int]]:
        return model.n_layers, list(range(model.n_layers))
