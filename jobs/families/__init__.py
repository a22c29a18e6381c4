"""The model families' behaviour: how a family lays out its network, splits training into
stages and, for a family that grows, grows. One file each in this package, a `Family` registered
under the family's name, reading its config (config/family.py):

dense:  L layers applied once each.
looped: prelude, a block of k layers applied `loops` times, coda.
lidas:  starts shallow and grows by one block per stage (Layer-wise Insertion at the middle).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, Optional, TypeVar

import torch
from torch import nn

from common.registry import Registry
from config.family import FamilyConfig
from config.model import ModelConfig
from jobs.model import Decoder

OptimizerFactory = Callable[[nn.Module], torch.optim.Optimizer]
C = TypeVar("C", bound=FamilyConfig)


@dataclass(frozen=True)
class Stage:
    start_step: int
    end_step: int  # exclusive
    n_layers: int  # effective depth during the stage


class Family(Generic[C]):
    """A family's behaviour over its config `self.config`; each family subclasses it."""

    def __init__(self, config: C):
        self.config = config

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
        raise ValueError(f"family {self.config.name} does not grow")

    def ancestors(self, model: ModelConfig, steps: int, n_layers: int) -> list[int]:
        """For each layer of the network at depth `n_layers`, the initial layer it descends from."""
        return list(range(n_layers))

    def lineage(self, n_from: int, n_to: int) -> list[int]:
        """For each unique layer of the network once it has `n_to` of them, the layer of the network
        with `n_from` that it is, or was copied from: how a head at one step is found at another
        (jobs/evals/mechanism.py). A family that does not grow keeps its layers."""
        if n_from != n_to:
            raise ValueError(f"family {self.config.name} does not grow: {n_from} layers never become {n_to}")
        return list(range(n_to))

    def duplicates(self, n_layers: int) -> list[tuple[int, int]]:
        """(copy, source) for every layer copied by a growth step, as indices of the network once it
        has `n_layers` unique layers; none in a family that does not grow."""
        return []


FAMILIES: Registry[type[Family]] = Registry("family", "jobs.families", "family.name")


def family_of(config: FamilyConfig) -> Family:
    """The behaviour of the family `config` configures."""
    return FAMILIES[config.name](config)


def build_model(config: FamilyConfig, model: ModelConfig, ancestors: Optional[list[int]] = None) -> Decoder:
    """The family's network: the initial one, or, given a checkpoint's ancestors, as grown since."""
    n_unique, plan = family_of(config).layer_plan(model, ancestors)
    return Decoder(model, n_unique, plan, ancestors)
