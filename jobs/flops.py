"""Training-FLOP accounting, so families are compared at equal compute.

Per token, at effective depth L (layers applied per forward pass, so a looped model pays for
every pass over its shared block):

    F(L) = 6 * (L * P_layer + V * d)  +  6 * L * n_ctx * d

    P_layer = d*H*hd + 2*d*K*hd + H*hd*d  +  3*d*d_ff     (q, k, v, o projections; SwiGLU)

with hd = d / H and K key/value heads. The first term is Kaplan's 6N (forward + backward over
the matrix weights and the LM head); the second is attention scores and values over a context
of n_ctx tokens. Norms and softmax are ignored.
"""

from collections.abc import Mapping

from jobs.families import stage_schedule


def flops_per_token(model_cfg: Mapping, effective_layers: int, n_ctx: int) -> int:
    d, heads, kv_heads = model_cfg["d_model"], model_cfg["n_heads"], model_cfg["n_kv_heads"]
    head_dim = d // heads
    attention = d * heads * head_dim + 2 * d * kv_heads * head_dim + heads * head_dim * d
    per_layer = attention + 3 * d * model_cfg["d_ff"]
    weights = effective_layers * per_layer + model_cfg["vocab_size"] * d
    return 6 * weights + 6 * effective_layers * n_ctx * d


def schedule_flops(cfg: Mapping, tokens_per_step: int, n_ctx: int) -> int:
    """Training FLOPs of the whole run: each stage's steps at that stage's depth."""
    return tokens_per_step * sum(
        (stage.end_step - stage.start_step) * flops_per_token(cfg["model"], stage.n_layers, n_ctx)
        for stage in stage_schedule(cfg)
    )


def lidas_flop_ratio(cfg: Mapping, n_ctx: int | None = None) -> float:
    """Training FLOPs of this run over a dense run of the same final depth and steps.

    n_ctx defaults to model.max_seq_len.
    """
    n_ctx = cfg["model"]["max_seq_len"] if n_ctx is None else n_ctx
    dense = cfg["train"]["steps"] * flops_per_token(cfg["model"], cfg["model"]["n_layers"], n_ctx)
    return schedule_flops(cfg, 1, n_ctx) / dense
