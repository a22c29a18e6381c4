"""Text path: byte tokenizer, KV-cache decoding, stop strings, GSM8K prompt and answer
extraction in the harness's format, the arith generator and its training stream, config checks."""
import copy
import dataclasses
import importlib.util
import re

import pandas as pd
import pytest
import torch
from test_model import build as build_model
from test_model import micro_cfg, trained_lidas

from config.data import ArithDataConfig, ArithSettings
from config.evals import Gsm8kSettings
from jobs import tokenizer
from jobs.data import arith, gsm8k
from jobs.evals.gsm8k import evaluate, exact_match, extract_flexible, extract_strict, prompt_text
from jobs.generate import greedy
from orchestrator.config import ConfigError, compose_run, hydra_session

DATA = ArithDataConfig(name="arith", kind="arith", vocab_size=tokenizer.VOCAB_SIZE, seed=5, seq_len=512,
                       arith=ArithSettings(max_number=9, two_step=0.3, train_problems=300, test_problems=50))


def test_byte_tokenizer_round_trips_and_drops_specials():
    text = "Question: 1,234 + ½ = ?\n#### -3.5 €"
    ids = tokenizer.encode(text, bos=True, eos=True)
    assert ids[0] == tokenizer.BOS and ids[-1] == tokenizer.EOS and max(ids[1:-1]) < 256
    assert len(ids) == len(text.encode("utf-8")) + 2
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(tokenizer.encode("€")[:2]) == "\ufffd"  # half a character, no error


# --- KV cache ---------------------------------------------------------------------------------

def models() -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    grown, _ = trained_lidas(micro_cfg("lidas"))
    return {"dense": build_model(micro_cfg("dense")), "looped": build_model(micro_cfg("looped")),
            "grown": grown}


@pytest.mark.parametrize("family", ["dense", "looped", "grown"])
def test_cached_incremental_logits_equal_the_full_forward(family):
    model = models()[family].eval()
    tokens = torch.randint(0, 16, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens)
        cache = model.new_cache()
        chunks = [model(tokens[:, :7], cache), model(tokens[:, 7:12], cache)]
        chunks += [model(tokens[:, i:i + 1], cache) for i in range(12, 20)]
    assert len(cache.keys) == len(model.plan)  # one entry per application (looped: per loop)
    assert cache.length == 20 and cache.keys[0].shape[2] == 20
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(tokens[:, :13], cache)


def test_greedy_decoding_equals_argmax_of_recomputed_forwards():
    model = build_model(micro_cfg("looped")).eval()
    prompt = [3, 1, 4, 1, 5]
    out = greedy(model, prompt, max_new_tokens=10, stops=())
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(10):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    assert out.n_tokens == 10 and out.stopped_by == "max_new_tokens"
    assert out.text == tokenizer.decode(ids[len(prompt):])


class Scripted(torch.nn.Module):
    """A stand-in decoder that emits a fixed byte string, for the stopping rules."""

    def __init__(self, text: str, eos: bool = False, max_seq_len: int = 4096):
        super().__init__()
        self.script = tokenizer.encode(text, eos=eos)
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.rope_cos = torch.zeros(max_seq_len, 1)

    def new_cache(self):
        return type("Cache", (), {"length": 0})()

    def forward(self, tokens, cache):
        if cache.length == 0:  # the prompt: emit the script's first byte next
            self.prompt_len = tokens.shape[1]
        cache.length += tokens.shape[1]
        index = cache.length - self.prompt_len
        logits = torch.zeros(1, tokens.shape[1], tokenizer.VOCAB_SIZE)
        logits[0, -1, self.script[min(index, len(self.script) - 1)]] = 1.0
        return logits


@pytest.mark.parametrize("script, text, stopped_by", [
    (" 3 + 4 = <<3+4=7>>7\n#### 7\n\nQuestion: more", " 3 + 4 = <<3+4=7>>7\n#### 7", "\n\n"),
    (" 7\nQuestion: Ann has", " 7\n", "Question:"),
    (" 7</s>junk", " 7", "</s>"),
    (" 7<|im_end|>", " 7", "<|im_end|>"),
])
def test_decoding_stops_at_the_harness_stop_strings(script, text, stopped_by):
    out = greedy(Scripted(script), [tokenizer.BOS, 65], max_new_tokens=100)
    assert (out.text, out.stopped_by) == (text, stopped_by)


def test_decoding_stops_at_eos_and_at_max_new_tokens():
    out = greedy(Scripted(" 12", eos=True), [65], 100)
    assert (out.text, out.n_tokens, out.stopped_by) == (" 12", 3, "eos")
    out = greedy(Scripted("#### 123456789"), [65], max_new_tokens=6)
    assert (out.text, out.stopped_by) == ("#### 1", "max_new_tokens")
    assert greedy(Scripted("#### 123456789", max_seq_len=5), [65, 66], 100).stopped_by == "max_seq_len"


# --- extraction and exact match ----------------------------------------------------------------

@pytest.mark.parametrize("generation, strict, flexible", [
    (" 3 + 4 = <<3+4=7>>7\n#### 7", "7", "7"),
    (" She pays $1,250.\n#### 1,250", "1,250", "1,250"),
    (" The answer is $12.50.", "[invalid]", "$12.50."),
    (" 5 - 8 = -3\n#### -3", "-3", "-3"),
    (" #### 4.5 then 6", "4.5", "6"),
    (" 12 apples, then 5", "[invalid]", "5"),
    (" I do not know", "[invalid]", "[invalid]"),
    ("####7", "[invalid]", "7"),
])
def test_strict_and_flexible_extraction(generation, strict, flexible):
    assert extract_strict(generation) == strict
    assert extract_flexible(generation) == flexible


@pytest.mark.parametrize("prediction, reference, match", [
    ("1,250", "So it costs 1250 dollars.\n#### 1250", True),
    ("$12.50.", "#### 12.50", True),
    ("-3", "#### -3", True),
    ("3", "#### -3", False),
    ("3.0", "#### 3", False),      # no numeric equivalence in the harness
    ("[invalid]", "#### 7", False),
    ("70", "#### 7", False),
])
def test_exact_match_normalises_like_the_harness(prediction, reference, match):
    assert exact_match(prediction, reference) is match


def test_prompt_text_is_the_harness_format():
    shots = [{"question": "Q1?", "answer": "1 + 1 = <<1+1=2>>2\n#### 2"}, {"question": "Q2?", "answer": "#### 5"}]
    assert prompt_text(shots, {"question": "Q3?", "answer": "#### 9"}) == (
        "Question: Q1?\nAnswer: 1 + 1 = <<1+1=2>>2\n#### 2\n\nQuestion: Q2?\nAnswer: #### 5\n\n"
        "Question: Q3?\nAnswer:")


def test_exact_match_on_scripted_generations_and_items():
    test = [{"question": f"q{i}", "answer": f"#### {answer}"} for i, answer in enumerate([7, 8, 7, 70])]
    train = [{"question": f"t{i}", "answer": f"#### {i}"} for i in range(10)]
    settings = Gsm8kSettings(n_shots=3, shot_seed=0, limit=None, max_new_tokens=30, path=None)
    result = evaluate(Scripted(" 3 + 4 = 7\n#### 7\n\n"), {"train": train, "test": test}, settings)
    assert result.metrics["gsm8k_em_strict"] == 0.5 and result.metrics["gsm8k_em_flexible"] == 0.5
    items = result.items
    assert set(items["metric"]) == {"gsm8k_em_strict", "gsm8k_em_flexible"} and len(items) == 8
    strict = items[items["metric"] == "gsm8k_em_strict"].set_index("item_id")
    assert strict["score"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert (strict["generation"] == " 3 + 4 = 7\n#### 7").all() and (strict["stopped_by"] == "\n\n").all()
    assert strict["target"].tolist() == ["7", "8", "7", "70"]
    pd.testing.assert_frame_equal(items, evaluate(Scripted(" 3 + 4 = 7\n#### 7\n\n"),
                                                  {"train": train, "test": test}, settings).items)
    with pytest.raises(ValueError, match="n_shots=11"):
        evaluate(Scripted(" 7"), {"train": train, "test": test}, dataclasses.replace(settings, n_shots=11))


def test_a_prompt_longer_than_the_context_is_cut_from_the_left():
    train = [{"question": "x" * 50, "answer": "#### 1"}] * 8
    settings = Gsm8kSettings(n_shots=8, shot_seed=0, limit=1, max_new_tokens=10, path=None)
    result = evaluate(Scripted(" 1\n\n", max_seq_len=100), {"train": train, "test": train}, settings)
    item = result.items.iloc[0]
    assert item["truncated"] and item["prompt_tokens"] == 90 and result.metrics["gsm8k_truncated"] == 1.0


# --- arith data --------------------------------------------------------------------------------

CALC = re.compile(r"<<(\d+)([+-])(\d+)=(\d+)>>")


def test_arith_splits_are_deterministic_disjoint_and_correct(tmp_path):
    splits = arith.splits(DATA)
    assert splits == arith.splits(copy.deepcopy(DATA))
    assert splits != arith.splits(dataclasses.replace(DATA, seed=6))
    assert len(splits["train"]) == 300 and len(splits["test"]) == 50
    assert not {p["question"] for p in splits["train"]} & {p["question"] for p in splits["test"]}
    for p in splits["train"] + splits["test"]:
        steps = CALC.findall(p["answer"])
        assert 1 <= len(steps) <= 2
        for a, op, b, c in steps:
            assert int(c) == (int(a) + int(b) if op == "+" else int(a) - int(b)) >= 0
        assert extract_strict(p["answer"]) == steps[-1][3] and exact_match(steps[-1][3], p["answer"])
    paths = arith.write_fixture(DATA, tmp_path)
    assert gsm8k.read_jsonl(paths["test"]) == splits["test"]
    assert gsm8k.load_split(str(tmp_path / "{split}.jsonl"), "train") == splits["train"]
    (tmp_path / "bad.jsonl").write_text('{"question": "q"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        gsm8k.read_jsonl(tmp_path / "bad.jsonl")


def test_arith_stream_is_a_pure_function_of_step_and_looks_like_prompts():
    stream = arith.TrainStream(DATA, seed=0, batch_size=4)
    x3, y3 = stream.batch(3)
    again = arith.TrainStream(DATA, seed=0, batch_size=4).batch(3)
    assert torch.equal(x3, again[0]) and torch.equal(y3, again[1])
    assert not torch.equal(x3, stream.batch(4)[0])
    assert not torch.equal(x3, arith.TrainStream(DATA, seed=1, batch_size=4).batch(3)[0])
    assert x3.shape == y3.shape == (4, 512) and torch.equal(x3[:, 1:], y3[:, :-1])
    assert (x3[:, 0] == tokenizer.BOS).all() and int(x3[:, 1:].max()) < 256
    text = tokenizer.decode(x3[0].tolist())
    assert text.startswith("Question: ") and "\nAnswer: " in text and "\n\nQuestion: " in text
    train_text = {gsm8k.shot(p) for p in arith.splits(DATA)["train"]}
    assert all(block + "\n\n" in train_text for block in text.split("\n\n")[:-1])


# --- config ------------------------------------------------------------------------------------

def compose(*overrides: str):
    with hydra_session():
        return compose_run(["tracker=none", *overrides])


def test_data_arith_config_and_its_refusals(tmp_path):
    cfg = compose("data=arith")
    assert cfg.data.kind == "arith" and cfg.eval.jobs == ["gsm8k"]
    assert cfg.model.vocab_size == tokenizer.VOCAB_SIZE and cfg.data.seq_len == 1152
    assert not hasattr(compose().data, "arith")  # regbench configs carry no arith section
    with pytest.raises(ConfigError, match=r"^eval.jobs: gsm8k needs data.kind=arith"):
        compose("eval.jobs=[gsm8k]")
    with pytest.raises(ConfigError, match=r"^eval.jobs: regbench needs data.kind=regbench"):
        compose("data=arith", "eval.jobs=[gsm8k,regbench]")
    with pytest.raises(ConfigError, match=r"^data.vocab_size=20: byte-level"):
        compose("data=arith", "data.vocab_size=20")
    with pytest.raises(ConfigError, match=r"^eval.gsm8k.path=.*is not a file"):
        compose("data=arith", f"eval.gsm8k.path={tmp_path}/none.jsonl")
    assert importlib.util.find_spec("datasets") is None  # not a dependency: hub is refused here
    with pytest.raises(ConfigError, match=r"^eval.gsm8k.path=hub: reading openai/gsm8k needs the `datasets`"):
        compose("data=arith", "eval.gsm8k.path=hub")
    with pytest.raises(ConfigError, match=r"^data.kind=text: no such data kind"):
        compose("data.kind=text")
    arith.write_fixture(compose("data=arith").data, tmp_path)
    assert compose("data=arith", f"eval.gsm8k.path='{tmp_path}/{{split}}.jsonl'").eval.gsm8k.path \
        == f"{tmp_path}/{{split}}.jsonl"
