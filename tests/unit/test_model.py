"""Decoder, layer plans, stage schedule, growth operator and FLOP accounting."""

import copy
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from config.backend import TorchBackendConfig
from config.family import DenseConfig, GrowthConfig, LidasConfig, LoopConfig, LoopedConfig
from config.model import ModelConfig
from config.resources import TrainResources
from config.train import TrainConfig
from jobs.families import Stage, build_model, family_of
from jobs.flops import flop_ratio, flops_per_token, schedule_flops
from jobs.model import Decoder, RMSNorm, rope_pairs, rope_tables, rotate_pairs
from jobs.optim import build_optimizer


def micro_cfg(family: str = "dense", steps: int = 30, **growth) -> SimpleNamespace:
    """The sections of a run config these tests need, small enough to train in well under a second."""
    families = {
        "dense": lambda: DenseConfig(name="dense"),
        "looped": lambda: LoopedConfig(name="looped", loop=LoopConfig(prelude_layers=1, block_layers=2, loops=2,
                                                                      coda_layers=1)),
        "lidas": lambda: LidasConfig(name="lidas", growth=GrowthConfig(**{
            "block_layers": 2, "initial_blocks": 1, "alpha": 1.0, "optimizer_state": "copy", **growth})),
    }
    return SimpleNamespace(
        seed=0, effective_init_seed=0, effective_data_seed=0, family=families[family](),
        model=ModelConfig(name="micro", d_model=32, n_layers=6, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=16,
                          max_seq_len=32, rope_theta=10000.0, norm_eps=1e-5, init_std=0.02, block_size=2,
                          tie_embeddings=True),
        train=TrainConfig(steps=steps, batch_size=8, lr=1e-2, min_lr_ratio=0.1, warmup_steps=3, weight_decay=0.1,
                          beta1=0.9, beta2=0.95, grad_clip=1.0, checkpoint_every=7, log_every=2, max_retries=2,
                          compile=False),
        backend=TorchBackendConfig(name="torch", device="cpu"),
        resources=TrainResources(cpus=1, gpus=0, memory_gb=1, nodes=1))


def build(cfg: SimpleNamespace, ancestors=None) -> Decoder:
    return build_model(cfg.family, cfg.model, ancestors)


def layer_plan(cfg: SimpleNamespace) -> tuple[int, list[int]]:
    return family_of(cfg.family).layer_plan(cfg.model)


def stage_schedule(cfg: SimpleNamespace) -> list[Stage]:
    return family_of(cfg.family).stages(cfg.model, cfg.train.steps)


def grow(model: Decoder, optimizer: torch.optim.Optimizer, cfg: SimpleNamespace) -> torch.optim.Optimizer:
    return family_of(cfg.family).grow(model, optimizer, lambda m: build_optimizer(m, cfg.train))


def tokens(batch: int = 2, seq: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 16, (batch, seq), generator=torch.Generator().manual_seed(seed))


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- decoder ---------------------------------------------------------------------------------

def test_logits_shape_dtype_and_tied_head():
    model = build(micro_cfg())
    logits = model(tokens())
    assert logits.shape == (2, 12, 16) and logits.dtype == torch.float32
    assert model.lm_head.weight is model.embed.weight
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())
    assert "rope_cos" not in model.state_dict()


def test_untied_head_is_a_separate_matrix():
    cfg = micro_cfg()
    cfg.model = dataclasses.replace(cfg.model, tie_embeddings=False)
    untied, tied = build(cfg), build(micro_cfg())
    assert n_params(untied) - n_params(tied) == 16 * 32


def test_future_tokens_do_not_change_earlier_logits():
    model = build(micro_cfg())
    original = tokens()
    changed = original.clone()
    changed[:, 7:] = (changed[:, 7:] + 3) % 16
    before, after = model(original), model(changed)
    torch.testing.assert_close(before[:, :7], after[:, :7], rtol=0, atol=1e-6)
    assert not torch.allclose(before[:, 7:], after[:, 7:])


def test_grouped_query_attention_matches_repeated_kv_heads():
    attn = build(micro_cfg()).layers[0].attn
    assert (attn.n_heads, attn.n_kv_heads) == (4, 2)
    assert attn.k_proj.weight.shape == (2 * 8, 32)
    q, k, v = torch.randn(2, 4, 10, 8), torch.randn(2, 2, 10, 8), torch.randn(2, 2, 10, 8)
    scores = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) / 8**0.5
    scores = scores.masked_fill(torch.ones(10, 10, dtype=torch.bool).triu(1), float("-inf"))
    expected = scores.softmax(-1) @ v.repeat_interleave(2, dim=1)
    torch.testing.assert_close(attn.attend(q, k, v), expected, rtol=1e-5, atol=1e-5)


def test_the_hand_written_rms_norm_backward_is_the_gradient_of_its_forward():
    """RMSNorm's backward pass (jobs/model.py) against numerical gradients in float64, and against
    autograd's own composite in float32 on the shapes of a step."""
    x64 = torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True)
    norm64 = RMSNorm(8, eps=1e-5).double()
    with torch.no_grad():
        norm64.weight.uniform_(0.5, 1.5)
    assert torch.autograd.gradcheck(norm64, (x64,))

    x = torch.randn(4, 16, 32, requires_grad=True)
    norm, grad = RMSNorm(32, eps=1e-5), torch.randn(4, 16, 32)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    fast = torch.autograd.grad(norm(x), (x, norm.weight), grad)
    composite = torch.autograd.grad(torch.nn.RMSNorm.forward(norm, x), (x, norm.weight), grad)
    for ours, theirs in zip(fast, composite):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


def rotate_halves(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as Llama writes it: channel i and i + head_dim/2 of x [..., T, head_dim] rotated by
    the angle whose cos and sin [T, head_dim // 2] are given."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)


def test_rotating_pairs_is_rotating_halves_with_the_channels_reordered():
    """Attention rotates queries and keys as channel pairs (2i, 2i + 1) of weights reordered by
    rope_pairs: the same values as Llama's rotation of halves, channels in pair order, and the
    same gradient (float64, numerically)."""
    heads, seq, head_dim, width = 3, 7, 8, 16
    cos, sin = (table.double() for table in rope_tables(head_dim, seq, 10000.0))
    weight = torch.randn(heads * head_dim, width, dtype=torch.float64)
    x = torch.randn(2, seq, width, dtype=torch.float64)
    halves = rotate_halves((x @ weight.T).view(2, seq, heads, head_dim).transpose(1, 2), cos, sin)
    pair_weight = rope_pairs(weight, heads).flatten(0, 2)
    projected = (x @ pair_weight.T).view(2, seq, heads, head_dim).requires_grad_()
    pairs = rotate_pairs(projected, cos[:, None], sin[:, None]).transpose(1, 2)
    order = torch.arange(head_dim).view(2, -1).T.flatten()  # pair order: 0, hd/2, 1, hd/2 + 1, ...
    torch.testing.assert_close(pairs, halves[..., order], rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda p: rotate_pairs(p, cos[:, None], sin[:, None]), (projected,))


def test_same_seed_same_init_and_init_std():
    torch.manual_seed(0)
    first = build(micro_cfg())
    torch.manual_seed(0)
    second = build(micro_cfg())
    for a, b in zip(first.parameters(), second.parameters()):
        assert torch.equal(a, b)
    assert first.layers[0].mlp.up_proj.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_plan_must_fit_the_layers():
    with pytest.raises(ValueError):
        Decoder(micro_cfg().model, 2, [0, 1, 2])


# --- layer plans and stages -----------------------------------------------------------------

def test_layer_plans():
    assert layer_plan(micro_cfg("dense")) == (6, [0, 1, 2, 3, 4, 5])
    assert layer_plan(micro_cfg("looped")) == (4, [0, 1, 2, 1, 2, 3])
    assert layer_plan(micro_cfg("lidas")) == (2, [0, 1])
    assert layer_plan(micro_cfg("lidas", initial_blocks=2)) == (4, [0, 1, 2, 3])


def test_looped_model_reuses_its_block():
    looped = build(micro_cfg("looped"))
    assert len(looped.layers) == 4 and looped.depth == 6
    dense = build(micro_cfg("dense"))
    assert n_params(dense) - n_params(looped) == 2 * n_params(dense.layers[0])
    applied = []
    hooks = [layer.register_forward_hook(lambda *_, n=n: applied.append(n))
             for n, layer in enumerate(looped.layers)]
    looped(tokens())
    for hook in hooks:
        hook.remove()
    assert applied == [0, 1, 2, 1, 2, 3]


def test_stage_schedule_prop_alpha():
    cfg = micro_cfg("lidas", steps=600)
    assert stage_schedule(cfg) == [Stage(0, 100, 2), Stage(100, 300, 4), Stage(300, 600, 6)]
    assert stage_schedule(micro_cfg("dense", steps=50)) == [Stage(0, 50, 6)]
    assert stage_schedule(micro_cfg("looped", steps=50)) == [Stage(0, 50, 6)]
    flat = stage_schedule(micro_cfg("lidas", steps=100, alpha=0.0))
    assert [s.end_step - s.start_step for s in flat] == [33, 34, 33]


@pytest.mark.parametrize("steps,alpha,initial", [(3, 2.0, 1), (7, 1.5, 1), (101, 1.0, 1), (10, 3.0, 2)])
def test_stage_schedule_covers_every_step(steps, alpha, initial):
    cfg = micro_cfg("lidas", steps=steps, alpha=alpha, initial_blocks=initial)
    stages = stage_schedule(cfg)
    assert stages[0].start_step == 0 and stages[-1].end_step == steps
    assert all(a.end_step == b.start_step for a, b in zip(stages, stages[1:]))
    assert all(s.end_step > s.start_step for s in stages)
    assert [s.n_layers for s in stages] == list(range(2 * initial, 7, 2))


# --- growth ---------------------------------------------------------------------------------

def trained_lidas(cfg: SimpleNamespace, steps: int = 2) -> tuple[Decoder, torch.optim.AdamW]:
    """A LIDAS model and optimizer with some AdamW state to carry through growth."""
    torch.manual_seed(0)
    model = build(cfg)
    optimizer = build_optimizer(model, cfg.train)
    for _ in range(steps):
        model(tokens()).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def test_growth_ancestry():
    cfg = micro_cfg("lidas")
    cfg.model = dataclasses.replace(cfg.model, n_layers=8)
    model, optimizer = trained_lidas(cfg, steps=0)
    seen = [model.ancestors]
    for _ in range(3):
        optimizer = grow(model, optimizer, cfg)
        seen.append(model.ancestors)
    assert seen == [[0, 1], [0, 1, 0, 1], [0, 1, 0, 1, 0, 1], [0, 1, 0, 1, 0, 1, 0, 1]]
    assert model.plan == list(range(8))

    cfg = micro_cfg("lidas", block_layers=3)
    cfg.model = dataclasses.replace(cfg.model, n_layers=9)
    model, optimizer = trained_lidas(cfg, steps=0)
    grow(model, optimizer, cfg)
    assert model.ancestors == [0, 1, 2, 0, 1, 2]


def test_growth_copies_the_middle_window():
    cfg = micro_cfg("lidas", initial_blocks=2)  # 4 layers: window is layers 1 and 2
    model, optimizer = trained_lidas(cfg)
    before = list(model.layers)
    grow(model, optimizer, cfg)
    assert [model.layers[i] for i in (0, 1, 2, 5)] == [before[i] for i in range(4)]
    for source, duplicate in ((1, 3), (2, 4)):
        assert model.layers[duplicate] is not model.layers[source]
        for a, b in zip(model.layers[source].parameters(), model.layers[duplicate].parameters()):
            assert torch.equal(a, b) and a is not b


def test_growth_copies_optimizer_state():
    cfg = micro_cfg("lidas")
    model, optimizer = trained_lidas(cfg)
    sources = [list(layer.parameters()) for layer in model.layers]
    optimizer = grow(model, optimizer, cfg)
    for source_params, copy_layer in zip(sources, model.layers[2:]):
        for source, duplicate in zip(source_params, copy_layer.parameters()):
            kept, cloned = optimizer.state[source], optimizer.state[duplicate]
            assert set(cloned) == {"step", "exp_avg", "exp_avg_sq"}
            for key in cloned:
                assert torch.equal(kept[key], cloned[key]) and kept[key] is not cloned[key]


def test_growth_can_reset_optimizer_state():
    cfg = micro_cfg("lidas", optimizer_state="reset")
    model, optimizer = trained_lidas(cfg)
    optimizer = grow(model, optimizer, cfg)
    assert all(p in optimizer.state for p in model.layers[:2].parameters())
    assert not any(p in optimizer.state for p in model.layers[2:].parameters())
    assert model.embed.weight in optimizer.state


def test_grown_model_and_optimizer_load_into_fresh_ones():
    cfg = micro_cfg("lidas")
    model, optimizer = trained_lidas(cfg)
    optimizer = grow(model, optimizer, cfg)
    model(tokens()).square().mean().backward()
    optimizer.step()
    fresh = build(cfg, model.ancestors)
    fresh_optimizer = build_optimizer(fresh, cfg.train)
    fresh.load_state_dict(model.state_dict())
    fresh_optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    assert fresh.ancestors == [0, 1, 0, 1]
    torch.testing.assert_close(fresh(tokens()), model(tokens()), rtol=0, atol=0)
    for ours, theirs in zip(optimizer.param_groups, fresh_optimizer.param_groups):
        for p, q in zip(ours["params"], theirs["params"]):
            assert torch.equal(optimizer.state[p]["exp_avg"], fresh_optimizer.state[q]["exp_avg"])


# --- FLOPs ----------------------------------------------------------------------------------

def test_flops_per_token_formula():
    model_cfg = micro_cfg().model  # d=32, H=4, K=2, hd=8, d_ff=64, V=16
    attention = 32 * 4 * 8 + 2 * 32 * 2 * 8 + 4 * 8 * 32
    per_layer = attention + 3 * 32 * 64
    assert flops_per_token(model_cfg, 6, 16) == 6 * (6 * per_layer + 16 * 32) + 6 * 6 * 16 * 32
    assert flops_per_token(model_cfg, 0, 16) == 6 * 16 * 32


def test_schedule_flops_by_family():
    dense, looped, lidas = (micro_cfg(f, steps=600) for f in ("dense", "looped", "lidas"))
    model_cfg = dense.model
    def flops(cfg):
        return schedule_flops(cfg.family, cfg.model, cfg.train.steps, 128, 16)
    assert flops(dense) == 600 * 128 * flops_per_token(model_cfg, 6, 16)
    assert flops(looped) == flops(dense)
    stages = [(100, 2), (200, 4), (300, 6)]
    expected = 128 * sum(steps * flops_per_token(model_cfg, depth, 16) for steps, depth in stages)
    assert flops(lidas) == expected


@pytest.mark.parametrize("blocks", [3, 8])
def test_lidas_flop_ratio_limit(blocks):
    """Without embedding and attention terms, Prop-1 from one block costs (2S+1)/(3S) of dense."""
    cfg = micro_cfg("lidas", steps=blocks * (blocks + 1) // 2 * 100)
    cfg.model = dataclasses.replace(cfg.model, n_layers=2 * blocks, vocab_size=0)
    assert flop_ratio(cfg.family, cfg.model, cfg.train.steps, n_ctx=0) == pytest.approx((2 * blocks + 1) / (3 * blocks))
    dense = micro_cfg("dense")
    assert flop_ratio(dense.family, dense.model, dense.train.steps) == 1.0
