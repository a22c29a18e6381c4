"""Head replacement against hand-edited forward passes, the few-shot tasks against an oracle that
reads the context, and the ablation eval's metrics against its own items."""
import numpy as np
import pytest
import torch

from jobs.data.fewshot import SEP, TASKS, suite, token_f1
from jobs.evals.ablation import head_count, score
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


@pytest.fixture(scope="module")
def micro_cfg():
    with hydra_session():
        yield compose_run(["size=micro", "family=looped", "eval.ablation.prompts=8", "eval.regbench.instances=20"])


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


def test_bad_fraction_is_a_config_error():
    with hydra_session(), pytest.raises(ConfigError, match="eval.ablation.fraction"):
        compose_run(["size=micro", "eval.ablation.fraction=1.5"])
