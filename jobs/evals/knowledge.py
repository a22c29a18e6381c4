"""Knowledge in the weights: closed-book recall of the facts seen in training (`data.facts`,
jobs/data/facts.py).

Each fact's key is queried without any context, in the form it was trained in: ``| | key``, and
the model's argmax continuation is compared with the fact's value. `knowledge_acc` is the share of
facts whose every value token is the argmax given the key and the value tokens before it (teacher
forcing, which for an exact match is the same as greedy decoding: a wrong first token fails the
fact either way). `knowledge_logprob` is the mean log-probability of a value given its key (nats,
over the whole vocabulary), a graded view of the same recall. `knowledge_chance` is the accuracy
of guessing uniformly among the symbols, 18^-value_length; a model that recalls nothing scores
about that (an untrained model answers nearly the same value to every key).

On data without facts (data.facts null) nothing was stored to recall: the evaluation records no
metrics and loads no model, so it can stay listed in eval.jobs for every RegBench run.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from common.metrics import MetricSpec
from config.data import N_SYMBOLS
from config.run import JobConfig
from jobs.backends import load_model
from jobs.contract import JobResult, Progress
from jobs.data.facts import Facts, facts_of
from jobs.data.regbench import regbench_data
from jobs.evals import evaluation

_BATCH = 4096  # queries per forward pass (bounds memory only)
LogitsFn = Callable[[torch.Tensor], torch.Tensor]

METRICS = {
    "knowledge_acc": MetricSpec("closed-book recall of facts seen in training (exact-match accuracy)",
                                higher_is_better=True, confirmatory_for=("regbench",),
                                claim="looped models recall fewer facts stored in the weights",
                                measured_with="facts in the training data (data.facts; the preset"
                                " experiment=knowledge) and the knowledge evaluation",
                                references=("knowledge_chance",)),
    "knowledge_logprob": MetricSpec("mean log-probability of a fact's value given its key (nats)",
                                    higher_is_better=True),
    "knowledge_chance": MetricSpec("closed-book recall by a uniform guess among the symbols", higher_is_better=True,
                                   reference=True),
}


def recall(facts: Facts, logits_fn: LogitsFn) -> tuple[np.ndarray, np.ndarray]:
    """Per fact: whether every value token is the argmax (bool ``[count]``) and the value's
    log-probability (``[count]``), from `logits_fn` (LongTensor inputs ``[B, T]`` -> logits
    ``[B, T, vocab]``) on ``| | key value`` without its last token."""
    tokens = torch.from_numpy(facts.tokens())
    n_values = facts.values.shape[1]
    values = tokens[:, -n_values:]
    correct, logprob = [], []
    with torch.no_grad():
        for start in range(0, len(tokens), _BATCH):
            batch = tokens[start:start + _BATCH]
            logits = logits_fn(batch[:, :-1])[:, -n_values:].float().cpu()
            target = values[start:start + _BATCH]
            correct.append((logits.argmax(-1) == target).all(-1))
            logprob.append(torch.log_softmax(logits, -1).gather(-1, target[..., None])[..., 0].sum(-1))
    return torch.cat(correct).numpy(), torch.cat(logprob).double().numpy()


def score(facts: Facts, logits_fn: LogitsFn) -> JobResult:
    correct, logprob = recall(facts, logits_fn)
    metrics = {"knowledge_acc": float(correct.mean()), "knowledge_logprob": float(logprob.mean()),
               "knowledge_chance": float(N_SYMBOLS ** -facts.values.shape[1])}
    n = len(correct)
    items = pd.DataFrame({"item_id": np.tile(np.arange(n), 2), "metric": np.repeat(["knowledge_acc",
                                                                                     "knowledge_logprob"], n),
                          "score": np.concatenate([correct.astype(float), logprob]), "weight": 1.0})
    return JobResult(metrics=metrics, items=items)


def has_facts(cfg: Any) -> bool:
    """Whether the run's data holds facts: what this evaluation measures something on."""
    return getattr(cfg.data, "facts", None) is not None


@evaluation("knowledge", title="Knowledge in the weights", metrics=METRICS, measures=has_facts)
def knowledge(cfg: JobConfig, run_dir: Path, progress: Progress) -> JobResult:
    """The registered job: the run's evaluated checkpoint queried on every fact of its data."""
    data = regbench_data(cfg.data)
    if data.facts is None:
        return JobResult(metrics={})
    model = load_model(cfg, run_dir)
    device = next(model.parameters()).device
    return score(facts_of(data.seed, data.facts), lambda inputs: model(inputs.to(device)))
