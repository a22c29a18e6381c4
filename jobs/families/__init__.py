"""The model families. A family is a config class registered under its name (one file each in
this package); it says how its network is laid out, how training is split into stages, and, for
a family that grows, how it grows:

dense:  L layers applied once each.
looped: prelude, a block of k layers applied `loops` times, coda.
lidas:  starts shallow and grows by one block per stage (Layer-wise Insertion at the middle).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn

from common.registry import Registry
from common.settings import setting
from jobs.model import Decoder, ModelConfig

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]


@dataclass(frozen=True)
class Stage:
    start_step: int
    end_step: int  # exclusive
    n_layers: int  # effective depth during the stage


@dataclass
class FamilyConfig:
    """What every family has; each family subclasses it with its own settings and layout."""
    name: str = setting()

    def derive(self, run: Any) -> None:
        """Replace the family's nulls by values derived from the size (before validation)."""

    def layer_plan(self, model: ModelConfig, ancestors: Optional[list[int]] = None) -> tuple[int, list[int]]:
        """(number of unique layers, application order) of the network; `ancestors` (from a
        checkpoint) describe a network that has grown since it was initialised."""
        raise NotImplementedError

    def stages(self, model: ModelConfig, steps: int) -> list[Stage]:
        """The training stages: one, at the family's depth, unless the family grows."""
        return [Stage(0, steps, len(self.layer_plan(model)[1]))]

    def grow(self, model: Decoder, optimizer: torch.optim.Optimizer,
             new_optimizer: OptimizerFactory) -> torch.optim.Optimizer:
        """Make `model` one growth step deeper; returns the optimizer for the grown model."""
        raise ValueError(f"family {self.name} does not grow")

    def ancestors(self, model: ModelConfig, steps: int, n_layers: int) -> list[int]:
        """For each layer of the network at depth `n_layers`, the initial layer it descends from."""
        return list(range(n_layers))


FAMILIES: Registry[type[FamilyConfig]] = Registry("family", "jobs.families", "family.name")


def build_model(family: FamilyConfig, model: ModelConfig, ancestors: Optional[list[int]] = None) -> Decoder:
    """The family's network: the initial one, or, given a checkpoint's ancestors, as grown since."""
    n_unique, plan = family.layer_plan(model, ancestors)
    return Decoder(model, n_unique, plan, ancestors)
