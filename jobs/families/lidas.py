"""lidas: LIDAS depth growth. Start with `initial_blocks` blocks of `block_layers` layers; at each
stage boundary copy the block at the layer-wise middle and insert it right after itself, until
model.n_layers. Stage i (i blocks) trains for a share of train.steps proportional to i**alpha
(Prop-alpha). Each layer remembers the layer of the initial network it descends from."""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from common.settings import require, section, setting
from jobs.families import FAMILIES, FamilyConfig, OptimizerFactory, Stage
from jobs.model import Decoder, ModelConfig


@dataclass
class GrowthConfig:
    block_layers: Optional[int] = setting(gt=0)  # null = model.block_size
    initial_blocks: int = setting(gt=0)
    alpha: float = setting(ge=0)
    optimizer_state: str = setting(choices=("copy", "reset"))  # copy: new layers take their source's AdamW moments

    @property
    def block(self) -> int:
        """block_layers once `LidasConfig.derive` has filled in the null."""
        assert self.block_layers is not None, "family.growth.block_layers is read before derive()"
        return self.block_layers


def growth_window(n_layers: int, block: int) -> slice:
    """The block_layers layers centred on the middle: the ones a LIDAS step duplicates."""
    start = n_layers // 2 - block // 2
    return slice(start, start + block)


def growth_sources(n_layers: int, block: int) -> list[int]:
    """For each layer after one LIDAS step, the layer it is (a copy of): the window is inserted
    again right after itself. Used by `grow` and by checkpoint surgery (jobs/nanotron)."""
    window = growth_window(n_layers, block)
    order = list(range(n_layers))
    return order[: window.stop] + order[window] + order[window.stop :]


@FAMILIES.register("lidas")
@dataclass
class LidasConfig(FamilyConfig):
    growth: GrowthConfig = section(GrowthConfig)

    def derive(self, run: Any) -> None:
        if self.growth.block_layers is None:
            self.growth.block_layers = run.model.block_size

    def check(self, run: Any) -> None:
        b, n0, n = self.growth.block, self.growth.initial_blocks, run.model.n_layers
        require(n % b == 0, f"family.growth.block_layers={b}: must divide model.n_layers={n}")
        require(n0 < n // b, f"family.growth.initial_blocks={n0}: the schedule does not grow (final "
                f"depth {n} = {n // b} blocks of {b}); use fewer initial blocks")
        stages = n // b - n0 + 1
        require(run.train.steps >= stages, f"train.steps={run.train.steps}: fewer than the {stages} "
                f"growth stages; raise train.steps")

    def layer_plan(self, model: ModelConfig, ancestors: Optional[list[int]] = None) -> tuple[int, list[int]]:
        n = len(ancestors) if ancestors is not None else self.growth.initial_blocks * self.growth.block
        return n, list(range(n))

    def stages(self, model: ModelConfig, steps: int) -> list[Stage]:
        """Stage i (i blocks) gets a share of the steps proportional to i**alpha. Boundaries are
        the rounded cumulative shares, so the lengths add up to `steps` exactly; each stage
        keeps at least one step."""
        block, n_layers = self.growth.block, model.n_layers
        if n_layers % block or not 1 <= self.growth.initial_blocks <= n_layers // block:
            raise ValueError(f"n_layers={n_layers} is not a whole number of blocks above initial_blocks")
        blocks = range(self.growth.initial_blocks, n_layers // block + 1)
        if steps < len(blocks):
            raise ValueError(f"{steps} steps cannot cover {len(blocks)} stages")
        weights = [i ** self.growth.alpha for i in blocks]
        stages, start, cumulative = [], 0, 0.0
        for position, (i, weight) in enumerate(zip(blocks, weights)):
            cumulative += weight
            stages_left = len(blocks) - 1 - position
            end = math.floor(steps * cumulative / sum(weights) + 0.5)
            end = min(max(end, start + 1), steps - stages_left)
            stages.append(Stage(start, end, i * block))
            start = end
        return stages

    def grow(self, model: Decoder, optimizer: torch.optim.Optimizer,
             new_optimizer: OptimizerFactory) -> torch.optim.Optimizer:
        """Copy the block at the middle and insert it right after itself.

        With optimizer_state "copy" the copies get clones of their sources' AdamW moments and
        step count, so both continue like the source did; "reset" starts them fresh. Returns the
        new optimizer; its parameter order equals a freshly built model's."""
        block, layers = self.growth.block, list(model.layers)
        window, sources = growth_window(len(layers), block), growth_sources(len(layers), block)
        copies = [copy.deepcopy(layer) for layer in layers[window]]
        model.layers = nn.ModuleList(layers[: window.stop] + copies + layers[window.stop :])
        model.ancestors = [model.ancestors[i] for i in sources]
        model.plan = list(range(len(model.layers)))

        grown = new_optimizer(model)
        for param in model.parameters():  # parameters that existed before keep their state
            if param in optimizer.state:
                grown.state[param] = optimizer.state[param]
        if self.growth.optimizer_state == "copy":
            for source_layer, copy_layer in zip(layers[window], copies):
                for source, duplicate in zip(source_layer.parameters(), copy_layer.parameters()):
                    if source in optimizer.state:
                        grown.state[duplicate] = {k: v.clone() for k, v in optimizer.state[source].items()}
        return grown

    def ancestors(self, model: ModelConfig, steps: int, n_layers: int) -> list[int]:
        """The growth operator applied stage by stage from the initial layers."""
        ancestors = list(range(self.stages(model, steps)[0].n_layers))
        while len(ancestors) < n_layers:
            ancestors = [ancestors[i] for i in growth_sources(len(ancestors), self.growth.block)]
        return ancestors
