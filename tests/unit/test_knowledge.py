"""Facts in the training data (data.facts, jobs/data/facts.py) and their closed-book recall
(jobs/evals/knowledge.py)."""
import dataclasses
import hashlib
import math

import numpy as np
import pytest
import torch

from config.data import IGNORE, N_SYMBOLS, PAD, SEP, DataWarmupConfig, FactsConfig
from jobs.data.facts import FactRows, facts_of
from jobs.data.regbench import TrainStream
from jobs.evals.knowledge import has_facts, knowledge, score
from jobs.families import build_model
from jobs.optim import build_optimizer, learning_rate
from jobs.registry import recording_jobs
from jobs.train import train_step
from orchestrator.config import ConfigError, compose_run, hydra_session
from orchestrator.identity import run_id, semantic_config
from test_model import micro_cfg
from test_regbench_data import SMALL

FACTS = FactsConfig(count=40, share=0.25, key_length=2, value_length=1)


def pairs(inputs: torch.Tensor, facts: FactsConfig) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The (key, value) pairs of fact rows, read back from their tokens."""
    length = 2 + facts.key_length + facts.value_length
    found = []
    for row in inputs.numpy():
        for start in range(0, len(row) - length + 1, length):
            fact = row[start:start + length]
            if fact[0] == SEP and fact[1] == SEP:
                found.append((tuple(fact[2:2 + facts.key_length]), tuple(fact[2 + facts.key_length:])))
    return found


def world(data_seed: int, facts: FactsConfig) -> dict[tuple[int, ...], tuple[int, ...]]:
    f = facts_of(data_seed, facts)
    return {tuple(k): tuple(v) for k, v in zip(f.keys.tolist(), f.values.tolist())}


def test_the_facts_are_the_data_settings_not_the_runs():
    """Every run seed trains on the same key -> value mapping, each key with its one value; another
    data seed or fact setting is another world, and more facts hold fewer."""
    facts = world(SMALL.seed, FACTS)
    assert len(facts) == FACTS.count
    cfg = dataclasses.replace(SMALL, facts=FACTS)
    for seed in (0, 1, 5):
        seen = pairs(TrainStream(cfg, seed=seed, batch_size=16).batch(3)[0], FACTS)
        assert len(seen) == 4 * (97 // 5)  # 4 fact rows (a quarter of 16), 19 facts of 5 tokens each
        assert all(facts[key] == value for key, value in seen)
    assert world(SMALL.seed + 1, FACTS) != facts
    longer = world(SMALL.seed, dataclasses.replace(FACTS, value_length=2))
    assert {len(v) for v in longer.values()} == {2} and set(longer) != set(facts)
    assert {len(k) for k in world(SMALL.seed, dataclasses.replace(FACTS, key_length=3))} == {3}
    more = world(SMALL.seed, dataclasses.replace(FACTS, count=80))
    assert len(more) == 80 and {k: more[k] for k in facts} == facts
    keys = facts_of(SMALL.seed, FACTS).keys
    assert len({tuple(k) for k in keys.tolist()}) == FACTS.count and keys.max() < N_SYMBOLS


def test_a_stream_with_facts_is_a_function_of_the_step_and_keeps_the_regimes_rows():
    cfg = dataclasses.replace(SMALL, facts=FACTS)
    stream, plain = TrainStream(cfg, seed=2, batch_size=16), TrainStream(SMALL, seed=2, batch_size=16)
    first = stream.batch(7)
    stream.batch(3)
    for a, b, c in zip(first, stream.batch(7), TrainStream(cfg, seed=2, batch_size=16).batch(7)):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert not torch.equal(first[0][12:], stream.batch(8)[0][12:])
    for mine, theirs in zip(first, plain.batch(7)):
        assert torch.equal(mine[:12], theirs[:12])  # the regime's rows: those of the stream without facts
    inputs, targets = first[0][12:], first[1][12:]
    assert ((inputs[:, 0:95:5] == SEP) & (inputs[:, 1:95:5] == SEP)).all() and (inputs[:, 95:] == PAD).all()
    # trained on exactly the value tokens: the token after every key
    following = torch.cat([inputs[:, 1:], torch.full((4, 1), PAD)], dim=1)
    value = torch.zeros(inputs.shape[1], dtype=torch.bool)
    value[3::5] = True  # 19 facts of 5 tokens fill 95 of the 97 tokens, pad after them
    assert torch.equal(targets != IGNORE, value.expand_as(targets))
    assert torch.equal(targets[:, value], following[:, value])
    for row in [*inputs, *stream.batch(9)[0][12:]]:
        facts = pairs(row[None], FACTS)
        assert len(set(facts)) == len(facts) == 19  # a row's facts are distinct: no value is in its context
    # RegBench strings are never empty, so | | marks the fact rows only
    regime = first[0][:12]
    assert not ((regime[:, :-1] == SEP) & (regime[:, 1:] == SEP)).any()


# Batches of the stream without facts, as it was before facts existed (digests taken then).
DIGESTS_BEFORE = {"plain": "3c001a4ff778b7b6", "warmup": "3d860370f1019f44"}


def _digest(stream: TrainStream, steps: tuple[int, ...]) -> str:
    h = hashlib.sha256()
    for step in steps:
        for tensor in stream.batch(step):
            h.update(tensor.numpy().tobytes())
    return h.hexdigest()[:16]


def test_data_without_facts_is_the_data_of_before():
    warm = dataclasses.replace(SMALL, warmup=DataWarmupConfig(steps=3, num_states=[6, 8], alphabet_size=[8, 10],
                                                              transitions_per_state=[1, 1]))
    assert _digest(TrainStream(SMALL, seed=0, batch_size=16), (0, 5)) == DIGESTS_BEFORE["plain"]
    assert _digest(TrainStream(warm, seed=2, batch_size=16), (1, 4)) == DIGESTS_BEFORE["warmup"]


def _trained_on_facts(steps: int):
    """A micro model trained `steps` steps on fact rows alone, and its facts."""
    torch.manual_seed(0)
    cfg = micro_cfg(steps=steps)
    model_cfg = dataclasses.replace(cfg.model, vocab_size=20, n_layers=2, block_size=1)
    model = build_model(cfg.family, model_cfg)
    optimizer = build_optimizer(model, cfg.train)
    facts = FactsConfig(count=48, share=0.5, key_length=2, value_length=1)
    rows = FactRows(SMALL.seed, facts, seed=0, batch_size=16, seq_len=model_cfg.max_seq_len - 1)
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, cfg.train)
        train_step(model, optimizer, *rows.batch(step), cfg.train.grad_clip)
    return model, facts_of(SMALL.seed, facts)


def test_a_model_trained_on_facts_recalls_them_and_an_untrained_one_does_not():
    untrained, facts = _trained_on_facts(0)
    trained, _ = _trained_on_facts(150)
    before, after = score(facts, untrained).metrics, score(facts, trained).metrics
    chance, n = 1 / N_SYMBOLS, len(facts.keys)
    assert before["knowledge_chance"] == after["knowledge_chance"] == pytest.approx(chance)
    sd = math.sqrt(chance * (1 - chance) / n)
    assert before["knowledge_acc"] < chance + 3 * sd < after["knowledge_acc"]
    assert after["knowledge_acc"] > 0.5
    assert before["knowledge_logprob"] < math.log(2 * chance) < after["knowledge_logprob"]
    items = score(facts, trained).items
    assert items is not None and len(items) == 2 * n
    recalled = items[items["metric"] == "knowledge_acc"]["score"]
    assert recalled.mean() == pytest.approx(after["knowledge_acc"]) and set(recalled) <= {0.0, 1.0}


def test_recall_is_scored_on_the_query_alone_and_needs_every_value_token():
    """The query is | | key, nothing before it; with a value of two tokens a fact counts only when
    both are the argmax."""
    facts = facts_of(SMALL.seed, dataclasses.replace(FACTS, count=5, value_length=2))
    seen = []

    def oracle(inputs: torch.Tensor) -> torch.Tensor:
        """Right on the first value token of every fact, right on the second for facts 0 and 1."""
        seen.append(inputs.clone())
        logits = torch.zeros(*inputs.shape, 20)
        logits[:, -2].scatter_(1, torch.from_numpy(facts.values[:, :1].copy()), 1.0)
        second = facts.values[:, 1].copy()
        second[2:] = (second[2:] + 1) % N_SYMBOLS
        logits[:, -1].scatter_(1, torch.from_numpy(second[:, None]), 1.0)
        return logits
    metrics = score(facts, oracle).metrics
    assert metrics["knowledge_acc"] == pytest.approx(2 / 5)
    assert metrics["knowledge_chance"] == pytest.approx(N_SYMBOLS ** -2)
    expected = np.concatenate([np.full((5, 2), SEP), facts.keys, facts.values[:, :1]], axis=1)
    assert torch.equal(seen[0], torch.from_numpy(expected))


# Ids of the default demo's runs computed before facts existed (docs/miniature.md, "The 9 runs"); the
# preset experiment=knowledge is the demo with facts, the ids of its measured runs pinned too.
IDS_BEFORE = {("family=dense", "seed=0"): "ee968f24acf2", ("family=lidas", "seed=2"): "6f260e8b20bd"}
IDS_WITH_FACTS = {("family=dense", "seed=0"): "44fdb7a67660", ("family=looped", "seed=0"): "a339a78c6ba3"}


def test_the_default_demo_keeps_its_ids_and_the_knowledge_preset_adds_facts():
    with hydra_session():
        for overrides, before in IDS_BEFORE.items():
            demo = compose_run(list(overrides))
            assert demo.data.facts is None and run_id(demo) == before
        for overrides, measured in IDS_WITH_FACTS.items():
            preset = compose_run([*overrides, "experiment=knowledge"])
            assert preset.data.facts == FactsConfig(count=128, share=0.125, key_length=2, value_length=1)
            assert run_id(preset) == measured and preset.train == compose_run(list(overrides)).train


def test_facts_are_in_the_run_id_only_when_set_and_bad_settings_are_refused():
    with hydra_session():
        plain = compose_run(["size=micro"])
        with_facts = compose_run(["size=micro", "+data.facts={count:50,share:0.25,key_length:2,value_length:1}"])
        refusals = {
            "train.batch_size=8": "+data.facts={count:50,share:0.05,key_length:2,value_length:1}",
            "324 distinct keys": "+data.facts={count:400,share:0.25,key_length:2,value_length:1}",
            "data.train_sequences": "+data.facts={count:50,share:0.25,key_length:2,value_length:1}",
        }
        for needle, facts in refusals.items():
            extra = ["data.train_sequences=100"] if needle == "data.train_sequences" else []
            with pytest.raises(ConfigError, match=needle):
                compose_run(["size=micro", facts, *extra])
    assert plain.data.facts is None and "facts" not in semantic_config(plain)["data"]
    assert run_id(with_facts) != run_id(plain)
    assert semantic_config(with_facts)["data"]["facts"]["count"] == 50


def test_knowledge_is_measured_only_on_data_with_facts(tmp_path):
    """Listed by default, it records nothing on data without facts (and loads no model), and
    planning does not count its metrics there."""
    with hydra_session():
        plain = compose_run(["size=micro"])
        with_facts = compose_run(["size=micro", "+data.facts={count:50,share:0.25,key_length:2,value_length:1}"])
    assert "knowledge" in plain.eval.jobs and not has_facts(plain) and has_facts(with_facts)
    assert knowledge(plain, tmp_path / "no-checkpoint", lambda report: None).metrics == {}
    assert "knowledge" not in [job.name for job in recording_jobs(plain)]
    assert "knowledge" in [job.name for job in recording_jobs(with_facts)]
