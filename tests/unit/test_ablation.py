"""Head replacement against hand-edited forward passes, the few-shot tasks against an oracle that
reads the context, the ablation eval's metrics against its own items, its random control against
the top heads, and its graded metrics on a model with a hand-built induction head."""
import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from jobs.data.fewshot import SEP, TASKS, suite, token_f1
from jobs.evals import EVALUATIONS
from jobs.evals.ablation import Suite, head_count, picking_probe, random_heads, score
from jobs.evals.induction import INDUCTION_FORMED, head_table, top_heads
from jobs.families import build_model
from jobs.interp import head_means, on_head_outputs, replace_heads
from jobs.model import Decoder, ModelConfig
from orchestrator.config import ConfigError, compose_run, hydra_session

MODEL = ModelConfig(name="test", d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=32, vocab_size=20,
                    max_seq_len=40, rope_theta=10000.0, norm_eps=1e-5, init_std=0.3, block_size=1,
                    tie_embeddings=True)


def _forward_without_attention_at(model: Decoder, tokens: torch.Tensor, skipped: int) -> torch.Tensor:
    """Decoder.forward by hand, leaving out the attention of one application."""
    cos, sin = model.rope_cos[:tokens.shape[1]], model.rope_sin[:tokens.shape[1]]
    x = model.embed(tokens)
    for step, index in enumerate(model.plan):
        block = model.layers[index]
        if step != skipped:
            x = x + block.attn(block.attn_norm(x), cos, sin)
        x = x + block.mlp(block.mlp_norm(x))
    return model.lm_head(model.norm(x))


def test_zeroing_one_application_of_a_shared_layer_equals_skipping_its_attention():
    torch.manual_seed(0)
    model = Decoder(MODEL, 2, [0, 1, 1, 0]).eval()  # layer 1 applied at steps 1 and 2
    tokens = torch.randint(0, 18, (3, 12))
    chosen = torch.zeros(4, 4, dtype=torch.bool)
    chosen[2] = True
    with torch.no_grad(), replace_heads(model, chosen, torch.zeros(4, 4, 4)):
        ablated = model(tokens)
        assert torch.equal(model(tokens), ablated)  # the application count restarts every pass
    torch.testing.assert_close(ablated, _forward_without_attention_at(model, tokens, 2))
    assert not torch.allclose(ablated, model(tokens))  # hooks removed on exit


def test_head_means_are_the_mean_o_proj_input_and_mean_ablation_changes_only_chosen_heads():
    torch.manual_seed(1)
    model = Decoder(MODEL, 1, [0, 0]).eval()
    tokens = torch.randint(0, 18, (4, 10))
    seen: list[torch.Tensor] = []
    model.layers[0].attn.o_proj.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    means = head_means(model, tokens)
    assert means.shape == (2, 4, 4)
    torch.testing.assert_close(means[1], seen[1].mean((0, 1)).view(4, 4))
    chosen = torch.zeros(2, 4, dtype=torch.bool)
    chosen[0, 3] = True
    outputs: list[torch.Tensor] = []
    with replace_heads(model, chosen, means), on_head_outputs(model, lambda a, heads: outputs.append(heads)):
        model(tokens)
    assert torch.equal(outputs[0][..., 3, :], means[0, 3].expand(4, 10, 4))
    torch.testing.assert_close(outputs[0][..., :3, :], seen[2].view(4, 10, 4, 4)[..., :3, :])


def _oracle(prompt: list[int], length: int) -> list[int]:
    """Continue by the symbol that followed the latest earlier occurrence of the current token (an
    in-context bigram reader that, like the models, never predicts ``|``)."""
    out = list(prompt)
    for _ in range(length):
        earlier = [i for i in range(len(out) - 1) if out[i] == out[-1] and out[i + 1] != SEP]
        out.append(out[earlier[-1] + 1])
    return out[len(prompt):]


@pytest.mark.parametrize("name", TASKS)
def test_every_task_is_solved_by_reading_the_context(name):
    task = next(t for t in suite(40, seed=3) if t.name == name)
    assert task.prompts.max() <= SEP and task.answers.max() < SEP
    for prompt, answer in zip(task.prompts.tolist(), task.answers.tolist()):
        assert _oracle(prompt, len(answer)) == answer
    assert torch.equal(suite(40, seed=3)[TASKS.index(name)].prompts, task.prompts)


def test_token_f1_counts_bag_overlap():
    assert token_f1([1, 2, 3, 4], [4, 3, 2, 1]) == 1.0
    assert token_f1([1, 1, 5, 6], [1, 2, 3, 4]) == 0.25
    assert token_f1([7], [8]) == 0.0
    assert [head_count(f, 12) for f in (0.01, 0.2, 0.4, 1.0)] == [1, 2, 5, 12]


SMALL_EVAL = ["eval.ablation.prompts=8", "eval.regbench.instances=20"]


@pytest.fixture(scope="module")
def micro_cfg():
    with hydra_session():
        yield compose_run(["size=micro", "family=looped", *SMALL_EVAL, "eval.ablation.ks=[1,4,16]"])


def test_ablation_metrics_match_their_items_and_repeat(micro_cfg):
    torch.manual_seed(0)
    model = build_model(micro_cfg.family, micro_cfg.model).eval()
    with torch.no_grad():  # an untrained model barely uses attention: make it matter
        for layer in model.layers:
            layer.attn.o_proj.weight.mul_(20)
    first, second = score(model, micro_cfg), score(model, micro_cfg)
    assert first.metrics == second.metrics
    items = first.items
    assert np.isclose((items["score"] * items["weight"]).sum() / items["weight"].sum(),
                      first.metrics["ablation_drop_f1"])
    curve = first.curves["ablation_by_fraction"]
    assert curve["fraction"] == [0.1, 0.2, 0.4] and len(curve["drop_f1"]) == 3
    assert first.metrics["ablation_drop_f1"] == curve["drop_f1"][1]
    assert first.metrics["ablation_tvd_rise_zero"] != first.metrics["ablation_tvd_rise"]
    # graded: a metric per k, k above the 8 head applications ablates them all, and the random
    # control is recorded only where k heads outside the top k remain
    graded = first.curves["ablation_by_k"]
    assert graded["k"] == [1, 4, 16] and graded["heads"] == [1, 4, 8]
    assert {f"ablation_drop_f1_k{k}" for k in (1, 4, 16)} | {f"ablation_tvd_rise_k{k}" for k in (1, 4, 16)} \
        <= set(first.metrics)
    assert "ablation_drop_f1_random_k4" in first.metrics and "ablation_drop_f1_random_k16" not in first.metrics
    assert graded["ablation_drop_f1_random"][2] is None
    assert first.metrics["ablation_drop_f1_k1"] == curve["drop_f1"][0]  # fraction 0.1 of 8 heads: the top one
    EVALUATIONS["ablation"].specs_of(first)  # every metric and curve recorded is declared


def test_bad_fraction_or_undeclared_k_is_a_config_error():
    with hydra_session():
        with pytest.raises(ConfigError, match="eval.ablation.fraction"):
            compose_run(["size=micro", "eval.ablation.fraction=1.5"])
        with pytest.raises(ConfigError, match="ks=.*choose one of: 1, 2, 4"):
            compose_run(["size=micro", "eval.ablation.ks=[1,3]"])


def _head_table(scores: np.ndarray) -> pd.DataFrame:
    """A head table of scores [applications, heads], as jobs/evals/induction.py lays it out."""
    applications, heads = scores.shape
    return pd.DataFrame({"application": np.repeat(np.arange(applications), heads),
                         "head": np.tile(np.arange(heads), applications), "score": scores.ravel()})


def test_random_control_excludes_the_top_and_the_induction_heads_and_matches_layers():
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 0.45, (5, 4))
    scores[2, :3] = [0.95, 0.9, 0.85]  # three induction heads in one layer: its matched draw falls short
    table = _head_table(scores)
    for k in range(1, 7):
        top = top_heads(table, k).index.to_numpy()
        pool = table.drop(index=top).query(f"score < {INDUCTION_FORMED}")
        draws = set()
        for seed in range(20):
            control = random_heads(table, top, seed)
            assert control is not None and len(set(control)) == k
            assert not set(control) & set(top) and set(control) <= set(pool.index)
            chosen = table.loc[control, "application"].value_counts()
            wanted = table.loc[top, "application"].value_counts()
            for application, rows in pool.groupby("application"):  # as many per layer as it can give
                assert chosen.get(application, 0) >= min(wanted.get(application, 0), len(rows)), (k, seed)
            draws.add(tuple(control))
        # the top head's layer has one head that is neither top nor an induction head: the only
        # matched draw; from two heads on the shortfall is drawn from the other layers, by seed
        assert draws == {(11,)} if k == 1 else len(draws) > 1
        assert random_heads(table, top, 3).tolist() == random_heads(table, top, 3).tolist()
    assert random_heads(table, top_heads(table, 11).index.to_numpy(), 0) is None  # 9 others
    few = _head_table(np.array([[0.9, 0.8, 0.7], [0.6, 0.1, 0.2]]))  # 3 others, 1 an induction head
    assert random_heads(few, top_heads(few, 3).index.to_numpy(), 0) is None


def test_heads_are_picked_on_sequences_the_scored_prompts_do_not_repeat(micro_cfg):
    """The copy task has the probe's form (| s | s); its prompts come from another seed stream, so
    no scored prompt is a sequence the heads were ranked on, also when the run and data seeds agree."""
    for seed in (0, micro_cfg.data.seed):
        cfg = dataclasses.replace(micro_cfg, seed=seed)
        probe = picking_probe(cfg)
        assert probe.shape[1] == 22  # | s | s with 10 symbols, as the copy task's s
        copy = next(task for task in Suite(build_model(cfg.family, cfg.model), cfg).tasks if task.name == "copy")
        picked = {tuple(row[1:11]) for row in probe.tolist()}
        assert not picked & {tuple(row[1:11]) for row in copy.prompts.tolist()}


INDUCTION_MODEL = ModelConfig(name="induction", d_model=128, n_layers=2, n_heads=2, n_kv_heads=2, d_ff=8,
                              vocab_size=20, max_seq_len=64, rope_theta=1e6, norm_eps=1e-5, init_std=0.02,
                              block_size=1, tie_embeddings=False)


def _induction_model() -> Decoder:
    """Two layers whose head 0s form an exact induction circuit, every other weight zero but the
    embedding and read-out: layer 0's head 0 attends to the previous position (rope's four fastest
    channel pairs, rotated to peak at distance 1) and writes that token into the residual; layer
    1's head 0 matches the current token against it (rope's slowest pairs, which barely turn within
    64 positions) and writes the token after the match, which the read-out predicts. The residual:
    token one-hot in 0..19, a constant in 20, previous token in 32..51, predicted token in 64..83."""
    model = Decoder(INDUCTION_MODEL, 2, [0, 1]).eval()
    hd, vocab = 64, 20
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in (model.norm, *(m for layer in model.layers for m in (layer.attn_norm, layer.mlp_norm))):
            norm.weight.fill_(1)
        tokens = torch.arange(vocab)
        model.embed.weight[tokens, tokens] = 8.0
        model.embed.weight[:, 20] = 8.0
        previous, induction = model.layers[0].attn, model.layers[1].attn
        freqs = INDUCTION_MODEL.rope_theta ** (-torch.arange(0, hd, 2) / hd)
        for m in range(4):  # q . k = sum_m cos((i - j - 1) freq_m), largest at distance 1
            previous.q_proj.weight[m, 20] = 2.0
            previous.k_proj.weight[m, 20], previous.k_proj.weight[m + hd // 2, 20] = 2 * freqs[m].cos(), \
                2 * freqs[m].sin()
        content = torch.cat([torch.arange(16, 32), torch.arange(48, 52)])  # slow channels, one per token
        previous.v_proj.weight[tokens, tokens] = 1.0
        previous.o_proj.weight[32 + tokens, tokens] = 1.0
        induction.q_proj.weight[content, tokens] = 3.0  # a match scores ~48 before the softmax
        induction.k_proj.weight[content, 32 + tokens] = 3.0
        induction.v_proj.weight[tokens, tokens] = 1.0
        induction.o_proj.weight[64 + tokens, tokens] = 1.0
        model.lm_head.weight[tokens, 64 + tokens] = 1.0
    return model


def test_ablating_a_perfect_induction_head_costs_more_than_the_random_control():
    with hydra_session():
        cfg = compose_run(["size=micro", *SMALL_EVAL, "eval.ablation.ks=[1,2]"])
    model = _induction_model()
    table = head_table(model, picking_probe(cfg))
    assert top_heads(table, 1)[["application", "head"]].values.tolist() == [[1, 0]]
    assert table["score"].max() > 0.9 and table["score"].nlargest(2).iloc[1] < INDUCTION_FORMED
    result = score(model, cfg)
    assert result.metrics["fewshot_f1"] > 0.8  # the circuit solves the tasks
    assert result.metrics["ablation_drop_f1_k1"] > 0.5
    assert result.metrics["ablation_drop_f1_k1"] > result.metrics["ablation_drop_f1_random_k1"] + 0.5
    assert result.metrics["ablation_tvd_rise_k1"] > result.metrics["ablation_tvd_rise_random_k1"]
