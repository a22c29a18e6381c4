"""Induction scores on hand-built patterns, hooked patterns against the model's own attention,
and the ancestry concentration test against hand-counted values."""
import dataclasses
import math
from itertools import combinations
from types import SimpleNamespace

import pandas as pd

import numpy as np
import torch

from config.evals import InductionSettings
from jobs.data.regbench import SEP, RegBenchDataConfig, heldout_walks
from jobs.evals.induction import (ancestor_heads, ancestry, ancestry_floor, concentration, concentration_test,
                                  even_attention_score, head_table, in_distribution_sequences, most_concentrated,
                                  repeated_sequences, score)
from jobs.families import family_of
from test_model import micro_cfg, rotate_halves
from jobs.interp import attention_patterns, induction_scores, induction_targets
from jobs.model import Decoder, ModelConfig

MODEL = ModelConfig(name="test", d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=32, vocab_size=20,
                    max_seq_len=32, rope_theta=10000.0, norm_eps=1e-5, init_std=0.3, block_size=1,
                    tie_embeddings=True)
DATA = RegBenchDataConfig(name="regbench", kind="regbench", vocab_size=20, n_symbols=18, seed=7,
                          num_states=[3, 5], alphabet_size=[3, 6], transitions_per_state=[1, 3],
                          strings_per_instance=[5, 8], string_length=[1, 8], train_automata=60,
                          heldout_automata=12, seq_len=32)


def test_planted_induction_head_scores_one_and_uniform_head_its_known_value():
    tokens = repeated_sequences(3, 5, seed=0)  # | s | s: 12 tokens
    target = induction_targets(tokens).float()
    seq = tokens.shape[1]
    uniform = torch.ones(seq, seq).tril() / torch.arange(1, seq + 1)[:, None]
    patterns = torch.stack([target, uniform.expand_as(target)], dim=1)[None]  # [1, B, 2, T, T]
    scores = induction_scores(patterns, tokens)
    assert scores[0, 0].item() == 1.0
    rows = [i for i in range(seq) if target[0, i].sum() > 0]
    assert rows == list(range(6, 12))  # the second separator (it matches the first) and the second copy
    assert math.isclose(scores[0, 1].item(), np.mean([1 / (i + 1) for i in rows]), rel_tol=1e-6)


def test_hooked_patterns_reproduce_the_attention_output_per_application():
    torch.manual_seed(0)
    model = Decoder(MODEL, 2, [0, 1, 1, 0]).eval()  # looped: layers applied twice, GQA
    tokens = repeated_sequences(2, 6, seed=1)
    patterns = attention_patterns(model, tokens)
    assert patterns.shape == (4, 2, 4, 14, 14)
    outputs = []
    model.layers[1].attn.register_forward_hook(lambda mod, args, out: outputs.append((mod, args)))
    model(tokens)
    attn, (x, cos, sin, *_) = outputs[1]  # layer 1's second application = plan step 2
    v = attn.v_proj(x).view(2, 14, 2, 4).transpose(1, 2).repeat_interleave(2, dim=1)
    q = rotate_halves(attn.q_proj(x).view(2, 14, 4, 4).transpose(1, 2), cos, sin)
    k = rotate_halves(attn.k_proj(x).view(2, 14, 2, 4).transpose(1, 2), cos, sin)
    torch.testing.assert_close(patterns[2] @ v, attn.attend(q, k, attn.v_proj(x).view(2, 14, 2, 4).transpose(1, 2)))
    table = head_table(model, tokens)
    assert table["iteration"].tolist()[::4] == [0, 0, 1, 1] and table["layer"].tolist()[::4] == [0, 1, 1, 0]


def test_concentration_counts_and_exact_p_value():
    groups = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2])  # 3 ancestors x 3 descendants
    assert concentration(groups, np.array([0, 1, 2]), 1) == 3
    stat, chance, p = concentration_test(groups, np.array([0, 1, 2]), 1, seed=0)
    assert stat == 3 and math.isclose(p, 3 / math.comb(9, 3))  # only the 3 all-one-ancestor sets
    _, _, p_spread = concentration_test(groups, np.array([0, 3, 6]), 1, seed=0)
    assert p_spread == 1.0 and chance > 1


def test_score_metrics_only_for_lidas_and_deterministic():
    torch.manual_seed(0)
    model = Decoder(MODEL, 4, [0, 1, 2, 3], ancestors=[0, 1, 0, 1]).eval()
    cfg = SimpleNamespace(seed=0, data=DATA, eval=SimpleNamespace(induction=InductionSettings(
        sequences=8, length=6, top_k=4, ancestors_m=2)))
    first, second = score(model, cfg), score(model, cfg)
    assert first.metrics == second.metrics
    assert 0 <= first.metrics["ancestry_p"] <= 1 and first.metrics["ancestry_top_in_best"] >= 2
    assert first.metrics["ancestry_min_p"] <= first.metrics["ancestry_p"]
    assert first.metrics["induction_max"] >= first.metrics["induction_topk_mean"] >= first.metrics["induction_mean"]
    assert len(first.curves["induction_heads"]["score"]) == 16
    assert first.curves["induction_heads"]["label"][-1] == "L3.H3 (from L1)"  # a grown network's heads
    dense = score(Decoder(MODEL, 4, [0, 1, 2, 3]).eval(), cfg)  # nothing grew: no ancestry statistic
    assert "ancestry_p" not in dense.metrics


def _lidas_heads(initial_blocks: int, n_layers: int, heads: int) -> pd.DataFrame:
    """The ancestry columns of a head table of a LIDAS network (blocks of 2) grown to n_layers."""
    cfg = micro_cfg("lidas", initial_blocks=initial_blocks)
    cfg.model = dataclasses.replace(cfg.model, n_layers=n_layers)
    ancestors = family_of(cfg.family).ancestors(cfg.model, 100, n_layers)
    return pd.DataFrame({"ancestor": np.repeat(ancestors, heads), "head": np.tile(np.arange(heads), n_layers)})


def test_ancestry_power_at_tiny_and_with_more_heads():
    """At tiny (4 layers grown to 6, 2 heads: 8 ancestor heads, 4 of them with two descendants) only
    a perfect concentration, 4 of the top 4 from 2 ancestor heads, reaches p < 0.05 (6 of the 495
    top-4 sets do so); a count of 3 does not, nor does any top 5 (m=2 caps the count at 4). A
    network grown more, with more heads, has power: 8 of its top 8 from 2 ancestor heads."""
    tiny = _lidas_heads(2, 6, 2)
    groups = ancestor_heads(tiny)
    best = most_concentrated(groups, 4)
    assert concentration(groups, best, 2) == max(concentration(groups, np.array(c), 2)
                                                 for c in combinations(range(12), 4)) == 4
    assert math.isclose(ancestry_floor(tiny, 4, 2, seed=0), 6 / 495)
    three = np.array([2, 6, 4, 0])  # L1.H0 twice, L2.H0, L0.H0
    count, chance, p = ancestry(tiny, tiny.loc[three], 2, seed=0)
    assert count == 3 and math.isclose(chance, 2.3636, rel_tol=1e-4) and p > 0.05
    assert ancestry_floor(tiny, 5, 2, seed=0) > 0.05  # raising top_k loses the power

    grown = _lidas_heads(1, 8, 4)  # 2 layers grown to 8: every ancestor head has 4 descendants
    assert ancestry_floor(grown, 8, 2, seed=0) < 1e-4
    planted = np.flatnonzero((grown["ancestor"] == 0) & grown["head"].isin([1, 2]))
    count, chance, p = ancestry(grown, grown.loc[planted], 2, seed=0)
    assert count == 8 and chance < 8 and p < 0.05


def _planted_model() -> Decoder:
    """Two layers by hand: layer 0 head 0 attends to the previous token (RoPE phases on the
    high-frequency channel pairs, from a constant residual direction) and writes that token's code
    into its own residual subspace; layer 1 head 0 queries with the current token's code against
    that subspace on the lowest-frequency pairs (RoPE barely rotates them), so it attends to the
    token after an earlier occurrence: an induction head. Every other head and MLP is zero."""
    cfg = dataclasses.replace(MODEL, d_model=64, n_heads=2, n_kv_heads=2, max_seq_len=32)
    model = Decoder(cfg, 2, [0, 1]).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        for module in model.modules():
            if isinstance(module, torch.nn.RMSNorm):
                module.weight.fill_(1.0)
        code = torch.nn.functional.normalize(torch.randn(20, 8, generator=torch.Generator().manual_seed(0)), dim=1)
        model.embed.weight[:, :8] = code
        model.embed.weight[:, 8] = 1.0  # the constant direction
        prev, slow = model.layers[0].attn, model.layers[1].attn
        freqs = 10000.0 ** (-torch.arange(16) / 16)
        for p in range(6):  # q = (1, 0), k = R(w) q per pair: scores peak at offset 1
            prev.q_proj.weight[p, 8] = 2.0
            prev.k_proj.weight[p, 8], prev.k_proj.weight[p + 16, 8] = 2.0 * freqs[p].cos(), 2.0 * freqs[p].sin()
        prev.v_proj.weight[torch.arange(8), torch.arange(8)] = 1.0
        prev.o_proj.weight[16 + torch.arange(8), torch.arange(8)] = 1.0  # head 0's output -> dims 16..23
        channels = torch.tensor([12, 13, 14, 15, 28, 29, 30, 31])
        slow.q_proj.weight[channels, torch.arange(8)] = 4.0
        slow.k_proj.weight[channels, 16 + torch.arange(8)] = 4.0
    return model


def test_planted_induction_head_in_a_model_scores_near_one_and_the_rest_low():
    model = _planted_model()
    tokens = repeated_sequences(16, 10, seed=2)
    patterns = attention_patterns(model, tokens)
    previous = patterns[0, :, 0].diagonal(offset=-1, dim1=-2, dim2=-1)
    assert previous.min() > 0.9  # layer 0 head 0 is the previous-token head it was built to be
    scores = induction_scores(patterns, tokens)
    assert scores[1, 0] > 0.9
    others = torch.cat([scores[0], scores[1, 1:]])
    assert others.max() < 0.3
    table = head_table(model, tokens)
    assert table.sort_values("score", ascending=False).iloc[0][["layer", "head"]].tolist() == [1, 0]


def test_the_in_distribution_probe_repeats_walks_of_held_out_automata_beside_its_chance_level():
    cfg = SimpleNamespace(data=DATA)
    tokens = in_distribution_sequences(cfg, 24, 8, seed=3)
    assert tokens.shape == (24, 18) and (tokens[:, [0, 9]] == SEP).all()
    assert torch.equal(tokens[:, 1:9], tokens[:, 10:])  # | s | s
    walks = heldout_walks(DATA, 24, 8, np.random.default_rng([3, 6]))
    np.testing.assert_array_equal(tokens[:, 1:9].numpy(), walks)
    assert torch.equal(tokens, in_distribution_sequences(cfg, 24, 8, seed=3))
    # Chance: the score of a head attending evenly to every position up to its own.
    seq = tokens.shape[1]
    even = (torch.ones(seq, seq).tril() / torch.arange(1, seq + 1)[:, None]).expand(1, 24, 1, seq, seq)
    expected = induction_scores(even, tokens)
    assert math.isclose(even_attention_score(tokens), expected.item(), rel_tol=1e-6)
