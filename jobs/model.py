"""A small Llama-style decoder whose layer stack can be shared (looped) or grown (LIDAS).

The unique layers live in `layers`; `plan` says in which order they are applied, so a looped
model applies the same module several times and a dense or grown model applies each once.
`ancestors[i]` is the layer of the initial network that layer i was copied from.
Decoding passes a `KVCache`, which holds keys and values per application of a layer (a looped
model's shared block gets one entry per loop), so generation costs one position per step.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from config.model import ModelConfig


def rope_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles, [max_seq_len, head_dim // 2]."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def rope_pairs(weight: Tensor, n_heads: int) -> Tensor:
    """A query or key projection's rows [n_heads * head_dim, d] as [n_heads, head_dim // 2, 2, d]:
    each pair of channels that RoPE rotates together, (i, i + head_dim/2) in the checkpoint's
    layout (Llama's), side by side, as `rotate_pairs` takes them. Attention scores are sums over
    channels, the same in any order both queries and keys share."""
    return weight.unflatten(0, (n_heads, 2, -1)).transpose(1, 2)


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the channel pairs (2i, 2i + 1) of x [..., head_dim] by the angles whose cos and sin
    are given (broadcast against [..., head_dim // 2]).

    Run eagerly, it is one complex multiplication by cos + i sin (its gradient, by the conjugate,
    one more): on the CPU a third of the time of four real products and a concatenation. Compiled,
    it is the real products, which Inductor fuses into one kernel (complex numbers it leaves to
    eager kernels). Half precision (autocast's bfloat16) is rotated in float32, as Llama's
    rotation promotes it against float32 tables."""
    if torch.compiler.is_compiling():
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2).type_as(x)
    pairs = torch.view_as_complex(x.to(torch.promote_types(x.dtype, torch.float32)).unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * torch.complex(cos, sin)).flatten(-2).type_as(x)


class _RMSNormFunction(torch.autograd.Function):
    """x * rsqrt(mean(x^2) + eps) * weight with its backward written out: on the CPU, autograd's
    composite takes about twice the time over the same activations (forward and backward of the
    `small` size's [32, 256, 128] at one thread: 10.4 ms against 5.5 ms)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        rstd = torch.rsqrt(x.square().mean(-1, keepdim=True).add_(eps))
        normed = x * rstd
        ctx.save_for_backward(normed, rstd, weight)
        return normed * weight

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        normed, rstd, weight = ctx.saved_tensors
        grad_normed = grad * weight
        grad_x = (grad_normed - normed * (grad_normed * normed).mean(-1, keepdim=True)).mul_(rstd)
        return grad_x, (grad * normed).flatten(0, -2).sum(0), None


class RMSNorm(nn.RMSNorm):
    """nn.RMSNorm (same parameter, same state dict) whose CPU path is _RMSNormFunction; on CUDA
    torch's own fused kernel is the faster one."""

    def forward(self, x: Tensor) -> Tensor:
        if x.is_cuda or self.eps is None:
            return super().forward(x)
        return _RMSNormFunction.apply(x, self.weight, self.eps)


class KVCache:
    """Keys and values of the positions seen so far, one entry per step of a decoder's plan."""

    def __init__(self, n_steps: int):
        self.keys: list[Tensor | None] = [None] * n_steps
        self.values: list[Tensor | None] = [None] * n_steps
        self.length = 0  # positions cached; advanced by Decoder.forward after all steps ran

    def extend(self, step: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append this step's new keys/values [B, kv_heads, T, head_dim]; return all of them."""
        cached_k, cached_v = self.keys[step], self.values[step]
        if cached_k is not None and cached_v is not None:
            k, v = torch.cat((cached_k, k), dim=2), torch.cat((cached_v, v), dim=2)
        self.keys[step], self.values[step] = k, v
        return k, v


class Attention(nn.Module):
    """Causal self-attention; n_kv_heads < n_heads shares each key/value head across a group.

    The three projections stay separate parameters in Llama's layout (checkpoints, growth, the
    nanotron bridge) but run as one matmul over their concatenated weights, the query and key rows
    reordered so that RoPE rotates adjacent pairs (`rope_pairs`, `rotate_pairs`): on the CPU at
    these widths a step is bound by the number of ops and memory passes as much as by FLOPs
    (docs/performance/trainer_speed.md). The keys of a `KVCache` are in that order too."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int):
        super().__init__()
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"need n_kv_heads | n_heads | d_model, got {n_kv_heads}, {n_heads}, {d_model}")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, d_model, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor,
                cache: tuple[KVCache, int] | None = None) -> Tensor:
        """`cache` = (the cache, this layer's step in the plan): x holds only the new positions."""
        q, k, v = self.project(x, cos, sin)
        if cache is not None:
            k, v = cache[0].extend(cache[1], k, v)
        heads = self.attend(q, k, v)
        return self.o_proj(heads.transpose(1, 2).flatten(2))

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries and keys rotated by position (cos, sin [T, head_dim // 2]), and values:
        [B, heads, T, head_dim], queries' and keys' channels in pair order (`rope_pairs`)."""
        batch, seq, _ = x.shape
        n_rotated = self.n_heads + self.n_kv_heads  # query and key heads, rotated in one pass
        weight = torch.cat((rope_pairs(self.q_proj.weight, self.n_heads),
                            rope_pairs(self.k_proj.weight, self.n_kv_heads),
                            self.v_proj.weight.unflatten(0, (self.n_kv_heads, -1, 2)))).flatten(0, 2)
        qk, v = F.linear(x, weight).view(batch, seq, n_rotated + self.n_kv_heads, self.head_dim).split(
            (n_rotated, self.n_kv_heads), dim=2)  # split, not two slices: its gradient is one concatenation
        q, k = rotate_pairs(qk, cos[:, None], sin[:, None]).transpose(1, 2).split(
            (self.n_heads, self.n_kv_heads), dim=1)
        return q, k, v.transpose(1, 2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Per-head outputs [B, n_heads, T_q, head_dim]; the one place that mixes positions.

        The T_q queries are the last T_q of the T_k key positions (T_q < T_k when decoding with
        a cache): query i sees keys up to T_k - T_q + i."""
        n_q, n_k = q.shape[-2], k.shape[-2]
        causal = n_q == n_k
        mask = None if causal else torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=self.n_kv_heads < self.n_heads
        )


class SwiGLU(nn.Module):
    """silu(gate(x)) * up(x), projected down. Gate and up stay two matmuls: fused into one (as
    Attention does q/k/v), the twice wider output falls out of the cache and a CPU step at the
    tiny and small sizes measured 5% slower, not faster."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.gate_proj = nn.Linear(d_model, d_ff, bias=False)
        self.up_proj = nn.Linear(d_model, d_ff, bias=False)
        self.down_proj = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm transformer layer. Holds no position tables, so a deep copy is just its weights."""

    def __init__(self, model_cfg: ModelConfig):
        super().__init__()
        d, eps = model_cfg.d_model, model_cfg.norm_eps
        self.attn_norm = RMSNorm(d, eps=eps)
        self.attn = Attention(d, model_cfg.n_heads, model_cfg.n_kv_heads)
        self.mlp_norm = RMSNorm(d, eps=eps)
        self.mlp = SwiGLU(d, model_cfg.d_ff)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor,
                cache: tuple[KVCache, int] | None = None) -> Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, cache)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    rope_cos: Tensor  # buffers (register_buffer), declared for the type checker
    rope_sin: Tensor

    def __init__(
        self,
        model_cfg: ModelConfig,
        n_unique_layers: int,
        plan: list[int],
        ancestors: list[int] | None = None,
    ):
        super().__init__()
        d, vocab = model_cfg.d_model, model_cfg.vocab_size
        self.ancestors = list(range(n_unique_layers)) if ancestors is None else list(ancestors)
        if len(self.ancestors) != n_unique_layers or not set(plan) <= set(range(n_unique_layers)):
            raise ValueError(f"plan {plan} / ancestors {ancestors} do not fit {n_unique_layers} layers")
        self.plan = list(plan)
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Block(model_cfg) for _ in range(n_unique_layers))
        self.norm = RMSNorm(d, eps=model_cfg.norm_eps)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        if model_cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_tables(d // model_cfg.n_heads, model_cfg.max_seq_len, model_cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        std = model_cfg.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=std)

    @property
    def depth(self) -> int:
        """Effective depth: layers applied per forward pass."""
        return len(self.plan)

    def new_cache(self) -> KVCache:
        """An empty cache for incremental decoding with this model's current plan."""
        return KVCache(len(self.plan))

    def forward(self, tokens: Tensor, cache: KVCache | None = None) -> Tensor:
        """tokens [B, T] int64 -> logits [B, T, vocab] float32. With a cache, `tokens` are the
        positions after those already in it, and the cache is extended by them."""
        start = 0 if cache is None else cache.length
        seq = tokens.shape[1]
        if start + seq > self.rope_cos.shape[0]:
            raise ValueError(f"{start + seq} positions exceed model.max_seq_len={self.rope_cos.shape[0]}")
        cos, sin = self.rope_cos[start:start + seq], self.rope_sin[start:start + seq]
        x = self.embed(tokens)
        for step, index in enumerate(self.plan):
            x = self.layers[index](x, cos, sin, None if cache is None else (cache, step))
        if cache is not None:
            cache.length += seq
        return self.lm_head(self.norm(x)).float()
