"""lidas: LIDAS depth growth. Start with `initial_blocks` blocks of `block_layers` layers; at each
stage boundary copy the block at the layer-wise middle and insert it right after itself, until
model.n_layers. Stage i (i blocks) trains for a share of train.steps proportional to i**alpha
(Prop-alpha). Each layer remembers the layer of the initial network it descends from."""
from __future__ import annotations

import copy
import math
from typing import Optional

import torch
from torch import nn

from config.family import LidasConfig
from config.model import ModelConfig
from jobs.families import FAMILIES, Family, OptimizerFactory, Stage
from jobs.model import Decoder


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
class Lidas(Family[LidasConfig]):
    def layer_plan(self, model: ModelConfig, ancestors: Optional[list[int]] = None) -> tuple[int, list[int]]:
        n = len(ancestors) if ancestors is not None else self.config.growth.initial_blocks * self.config.block_layers
        return n, list(range(n))

    def stages(self, model: ModelConfig, steps: int) -> list[Stage]:
        """Stage i (i blocks) gets a share of the steps proportional to i**alpha. Boundaries are
        the rounded cumulative shares, so the lengths add up to `steps` exactly; each stage
        keeps at least one step."""
        block, n_layers = self.config.block_layers, model.n_layers
        if n_layers % block or not 1 <= self.config.growth.initial_blocks <= n_layers // block:
            raise ValueError(f"n_layers={n_layers} is not a whole number of blocks above initial_blocks")
        blocks = range(self.config.growth.initial_blocks, n_layers // block + 1)
        if steps < len(blocks):
            raise ValueError(f"{steps} steps cannot cover {len(blocks)} stages")
        weights = [i ** self.config.growth.alpha for i in blocks]
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
        block, layers = self.config.block_layers, list(model.layers)
        window, sources = growth_window(len(layers), block), growth_sources(len(layers), block)
        copies = [copy.deepcopy(layer) for layer in layers[window]]
        model.layers = nn.ModuleList(layers[: window.stop] + copies + layers[window.stop :])
        model.ancestors = [model.ancestors[i] for i in sources]
        model.plan = list(range(len(model.layers)))

        grown = new_optimizer(model)
        for param in model.parameters():  # parameters that existed before keep their state
            if param in optimizer.state:
                grown.state[param] = optimizer.state[param]
        if self.config.growth.optimizer_state == "copy":
            for source_layer, copy_layer in zip(layers[window], copies):
                for source, duplicate in zip(source_layer.parameters(), copy_layer.parameters()):
                    if source in optimizer.state:
                        grown.state[duplicate] = {k: v.clone() for k, v in optimizer.state[source].items()}
        return grown

    def ancestors(self, model: ModelConfig, steps: int, n_layers: int) -> list[int]:
        """The growth operator applied stage by stage from the initial layers."""
        return self.lineage(self.stages(model, steps)[0].n_layers, n_layers)

    def lineage(self, n_from: int, n_to: int) -> list[int]:
        """The growth operator applied from depth `n_from` until `n_to`: a copy maps to the layer it
        was copied from, as its source does."""
        block, order = self.config.block_layers, list(range(n_from))
        while len(order) < n_to:
            order = [order[i] for i in growth_sources(len(order), block)]
        if len(order) != n_to:
            raise ValueError(f"lidas grows by {block} layers: {n_from} layers never become {n_to}")
        return order

    def duplicates(self, n_layers: int) -> list[tuple[int, int]]:
        """Each growth step's (copy, source) pairs, followed through the later steps as modules: a
        growth keeps every existing layer (the source too) where it was before the window's end and
        moves those after it by one block, so a pair stays the same two modules however often the
        network grows after it (and a source copied again makes a pair of its own)."""
        block = self.config.block_layers
        depth, pairs = self.config.growth.initial_blocks * block, list[tuple[int, int]]()
        while depth < n_layers:
            stop = growth_window(depth, block).stop
            pairs = [(c + block if c >= stop else c, s + block if s >= stop else s) for c, s in pairs]
            pairs += [(stop + i, stop - block + i) for i in range(block)]
            depth += block
        if depth != n_layers:
            raise ValueError(f"lidas grows by {block} layers: {n_layers} layers is no depth it reaches")
        return pairs
