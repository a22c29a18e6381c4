"""dense: L unique layers applied once each."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from jobs.families import FAMILIES, FamilyConfig
from jobs.model import ModelConfig


@FAMILIES.register("dense")
@dataclass
class DenseConfig(FamilyConfig):
    def layer_plan(self, model: ModelConfig, ancestors: Optional[list[int]] = None) -> tuple[int, list[int]]:
        return model.n_layers, list(range(model.n_layers))
