"""dense: L unique layers applied once each."""
from __future__ import annotations

from typing import Optional

from config.family import DenseConfig
from config.model import ModelConfig
from jobs.families import FAMILIES, Family


@FAMILIES.register("dense")
class Dense(Family[DenseConfig]):
    def layer_plan(self, model: ModelConfig, ancestors: Optional[list[int]] = None) -> tuple[int, list[int]]:
        return model.n_layers, list(range(model.n_layers))
