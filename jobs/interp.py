"""Attention patterns and per-head outputs of a trained decoder, read and replaced through hooks
(the model is not edited).

Each call of a layer's attention is one *application* (a looped model's shared block is applied
several times, each with its own pattern); applications are numbered in plan order.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import cast

import torch
from torch import Tensor

from jobs.model import Attention, Block, Decoder


def pattern(attn: Attention, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """softmax(q k^T / sqrt(hd)) with the causal mask, [B, n_heads, T, T], recomputed with the
    module's own projection; each query head uses its grouped key head (GQA)."""
    seq = x.shape[1]
    q, k, _ = attn.project(x, cos, sin)
    k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim)
    future = torch.ones(seq, seq, dtype=torch.bool, device=x.device).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(dim=-1)


@torch.no_grad()
def attention_patterns(model: Decoder, tokens: Tensor) -> Tensor:
    """Patterns of every application, [len(model.plan), B, n_heads, T, T]."""
    found: list[Tensor] = []

    def record(module: Attention, args: tuple, _output: Tensor) -> None:
        x, cos, sin = args[:3]
        found.append(pattern(module, x, cos, sin))

    handles = [cast(Block, layer).attn.register_forward_hook(record) for layer in model.layers]
    try:
        model(tokens)
    finally:
        for handle in handles:
            handle.remove()
    return torch.stack(found)


@torch.no_grad()
def layer_calls(model: Decoder, tokens: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
    """The arguments of every application's layer call (the residual stream entering it, and the
    rope tables), in plan order: so that any layer can be run on the input another one received."""
    calls: list[tuple[Tensor, Tensor, Tensor]] = []

    def record(_module: Block, args: tuple) -> None:
        calls.append((args[0], args[1], args[2]))

    handles = [layer.register_forward_pre_hook(record) for layer in model.layers]
    try:
        model(tokens)
    finally:
        for handle in handles:
            handle.remove()
    return calls


def induction_targets(tokens: Tensor) -> Tensor:
    """Prefix-matching pattern P [B, T, T]: P[i, j] = 1 iff j - 1 < i, j <= i and token[j - 1] ==
    token[i], i.e. j follows an earlier occurrence of the current token."""
    same = tokens[:, :, None] == tokens[:, None, :]  # [B, i, j-1]
    seq = tokens.shape[1]
    earlier = torch.ones(seq, seq, dtype=torch.bool).tril(-1)
    target = torch.zeros_like(same)
    target[:, :, 1:] = (same & earlier)[:, :, :-1]
    return target


def induction_scores(patterns: Tensor, tokens: Tensor) -> Tensor:
    """Mean attention mass on the prefix-matching positions, over rows that have one (the "mul"
    measure: mass on P over total mass, which is 1), [applications, n_heads]."""
    target = induction_targets(tokens).to(patterns.dtype)  # [B, T, T]
    rows = target.sum(-1) > 0  # [B, T]
    mass = (patterns * target[None, :, None]).sum(-1)  # [A, B, H, T]
    return (mass * rows[None, :, None]).sum((1, 3)) / rows.sum()


HeadFn = Callable[[int, Tensor], Tensor | None]  # (application, heads [B, T, n_heads, head_dim]) -> new heads


@contextmanager
def on_head_outputs(model: Decoder, fn: HeadFn) -> Iterator[None]:
    """Within the block, every application's per-head outputs (o_proj's input, the heads side by
    side) pass through `fn`, which may return replacements. Applications are counted from each
    forward pass's start, so a shared o_proj knows which of its applications it is serving."""
    step = [0]

    def restart(_module: Decoder, _args: tuple) -> None:
        step[0] = 0

    def per_head(module: torch.nn.Linear, args: tuple) -> tuple | None:
        (joined,) = args
        application, step[0] = step[0], step[0] + 1
        heads = cast(Block, model.layers[model.plan[application]]).attn.n_heads
        new = fn(application, joined.unflatten(-1, (heads, -1)))
        return None if new is None else (new.flatten(-2),)

    handles = [model.register_forward_pre_hook(restart)]
    handles += [cast(Block, layer).attn.o_proj.register_forward_pre_hook(per_head) for layer in model.layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def head_means(model: Decoder, tokens: Tensor) -> Tensor:
    """Each application's per-head output averaged over batch and positions, [applications,
    n_heads, head_dim]: the mean-ablation replacement."""
    means: list[Tensor] = []
    with on_head_outputs(model, lambda _application, heads: means.append(heads.mean((0, 1)))):
        model(tokens)
    return torch.stack(means)


@contextmanager
def replace_heads(model: Decoder, chosen: Tensor, values: Tensor) -> Iterator[None]:
    """Within the block, head h of application a outputs values[a, h] at every position wherever
    chosen[a, h] (bool [applications, n_heads]); zeros for zero-ablation, `head_means` for mean."""
    def replace(application: int, heads: Tensor) -> Tensor | None:
        mask = chosen[application]
        if not mask.any():
            return None
        return torch.where(mask[:, None], values[application].to(heads.dtype), heads)

    with on_head_outputs(model, replace):
        yield
