"""The three model families: layer plans, the LIDAS stage schedule and the growth operator.

dense:  L layers applied once each.
looped: prelude, a block of k layers applied `loops` times, coda.
lidas:  starts with `initial_blocks` blocks of `block_layers` layers and grows by one block per
        stage, copying the block at the layer-wise middle (Layer-wise Insertion at the middle,
        "LIDAS"); stage lengths follow Prop-alpha (T_i proportional to i**alpha).
"""

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from jobs.model import Decoder


@dataclass(frozen=True)
class Stage:
    start_step: int
    end_step: int  # exclusive
    n_layers: int  # effective depth during the stage


def layer_plan(cfg: Mapping) -> tuple[int, list[int]]:
    """(number of unique layers, application order) of the family's initial network."""
    family = cfg["family"]
    if family["name"] == "dense":
        n = cfg["model"]["n_layers"]
        return n, list(range(n))
    if family["name"] == "looped":
        loop = family["loop"]
        prelude, block, coda = loop["prelude_layers"], loop["block_layers"], loop["coda_layers"]
        plan = (
            list(range(prelude))
            + list(range(prelude, prelude + block)) * loop["loops"]
            + list(range(prelude + block, prelude + block + coda))
        )
        return prelude + block + coda, plan
    if family["name"] == "lidas":
        growth = family["growth"]
        n = growth["initial_blocks"] * growth["block_layers"]
        return n, list(range(n))
    raise ValueError(f"unknown family {family['name']!r}")


def stage_schedule(cfg: Mapping) -> list[Stage]:
    """Training stages; LIDAS stage i (i blocks) gets a share of the steps proportional to i**alpha.

    Boundaries are the rounded cumulative shares, so the lengths add up to train.steps exactly;
    each stage keeps at least one step.
    """
    steps = cfg["train"]["steps"]
    if cfg["family"]["name"] != "lidas":
        return [Stage(0, steps, len(layer_plan(cfg)[1]))]
    growth = cfg["family"]["growth"]
    block, n_layers = growth["block_layers"], cfg["model"]["n_layers"]
    if n_layers % block or not 1 <= growth["initial_blocks"] <= n_layers // block:
        raise ValueError(f"n_layers={n_layers} is not a whole number of blocks above initial_blocks")
    blocks = range(growth["initial_blocks"], n_layers // block + 1)
    if steps < len(blocks):
        raise ValueError(f"{steps} steps cannot cover {len(blocks)} stages")
    weights = [i ** growth["alpha"] for i in blocks]
    stages, start, cumulative = [], 0, 0.0
    for position, (i, weight) in enumerate(zip(blocks, weights)):
        cumulative += weight
        stages_left = len(blocks) - 1 - position
        end = math.floor(steps * cumulative / sum(weights) + 0.5)
        end = min(max(end, start + 1), steps - stages_left)
        stages.append(Stage(start, end, i * block))
        start = end
    return stages


def build_model(cfg: Mapping, ancestors: list[int] | None = None) -> Decoder:
    """The family's initial network, or, given a checkpoint's ancestors, a LIDAS stack grown to them."""
    n_unique, plan = layer_plan(cfg)
    if ancestors is not None and cfg["family"]["name"] == "lidas":
        n_unique, plan = len(ancestors), list(range(len(ancestors)))
    return Decoder(cfg["model"], n_unique, plan, ancestors)


def build_optimizer(model: nn.Module, train_cfg: Mapping) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not norms), params in model order.

    The order matters: it is how optimizer state is matched to parameters when a checkpoint
    is loaded into a freshly built model.
    """
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": train_cfg["weight_decay"]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=train_cfg["lr"], betas=(train_cfg["beta1"], train_cfg["beta2"]), eps=1e-8
    )


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


def grow(model: Decoder, optimizer: torch.optim.Optimizer, cfg: Mapping) -> torch.optim.AdamW:
    """LIDAS step: copy the block_layers layers centred on the middle and insert them right after.

    With optimizer_state "copy" (the default) the copies get clones of their sources' AdamW
    moments and step count, so both continue like the source did; "reset" starts them fresh.
    Returns the rebuilt optimizer; its parameter order equals a freshly built model's.
    """
    growth = cfg["family"]["growth"]
    mode = growth["optimizer_state"]
    if mode not in ("copy", "reset"):
        raise ValueError(f"optimizer_state must be 'copy' or 'reset', got {mode!r}")
    block, layers = growth["block_layers"], list(model.layers)
    window, sources = growth_window(len(layers), block), growth_sources(len(layers), block)
    copies = [copy.deepcopy(layer) for layer in layers[window]]
    model.layers = nn.ModuleList(layers[: window.stop] + copies + layers[window.stop :])
    model.ancestors = [model.ancestors[i] for i in sources]
    model.plan = list(range(len(model.layers)))

    new_optimizer = build_optimizer(model, cfg["train"])
    for param in model.parameters():  # parameters that existed before keep their state
        if param in optimizer.state:
            new_optimizer.state[param] = optimizer.state[param]
    if mode == "copy":
        for source_layer, copy_layer in zip(layers[window], copies):
            for source, duplicate in zip(source_layer.parameters(), copy_layer.parameters()):
                if source in optimizer.state:
                    new_optimizer.state[duplicate] = {k: v.clone() for k, v in optimizer.state[source].items()}
    return new_optimizer
