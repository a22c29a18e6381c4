"""Training-FLOP accounting, so families are compared at equal compute.

Per token, at effective depth L (layers applied per forward pass, so a looped model pays for
every pass over its shared block):

    F(L) = 6 * (L * P_layer + V * d)  +  6 * L * n_ctx * d

    P_layer = d*H*hd + 2*d*K*hd + H*hd*d  +  3*d*d_ff     (q, k, v, o projections; SwiGLU)

with hd = d / H and K key/value heads. The first term is Kaplan's 6N (forward + backward over
the matrix weights and the LM head); the second is attention scores and values over a context
of n_ctx tokens. Norms and softmax are ignored.
"""
from __future__ import annotations

from typing import Optional

from config.family import FamilyConfig
from config.model import ModelConfig
from jobs.families import family_of


def flops_per_token(model: ModelConfig, effective_layers: int, n_ctx: int) -> int:
    d, heads, kv_heads = model.d_model, model.n_heads, model.n_kv_heads
    head_dim = d // heads
    attention = d * heads * head_dim + 2 * d * kv_heads * head_dim + heads * head_dim * d
    per_layer = attention + 3 * d * model.d_ff
    weights = effective_layers * per_layer + model.vocab_size * d
    return 6 * weights + 6 * effective_layers * n_ctx * d


def schedule_flops(family: FamilyConfig, model: ModelConfig, steps: int, tokens_per_step: int,
                   n_ctx: int) -> int:
    """Training FLOPs of the whole run: each stage's steps at that stage's depth."""
    return tokens_per_step * sum(
        (stage.end_step - stage.start_step) * flops_per_token(model, stage.n_layers, n_ctx)
        for stage in family_of(family).stages(model, steps))


def flop_ratio(family: FamilyConfig, model: ModelConfig, steps: int, n_ctx: Optional[int] = None) -> float:
    """Training FLOPs of this family's schedule over a dense run of the same final depth and
    steps (LIDAS's saving is 1 minus this); n_ctx defaults to model.max_seq_len."""
    n_ctx = model.max_seq_len if n_ctx is None else n_ctx
    dense = steps * flops_per_token(model, model.n_layers, n_ctx)
    return schedule_flops(family, model, steps, 1, n_ctx) / dense
