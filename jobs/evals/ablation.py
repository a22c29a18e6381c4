"""Head ablation (paper-spec 3.4, 4): how much the few-shot tasks and held-out RegBench rely on
the strongest induction heads.

Heads are ranked by the induction eval's prefix-matching score (a looped block's head once per
application). The top fraction f of them (at least one) has its per-head output, o_proj's input,
replaced at every position by
- its mean over a reference batch of training-distribution RegBench instances (mean-ablation, the
  measured effect),
- zero (control: how much of the effect is the mere shift off the mean),
- or the same is done to as many heads drawn at random, seeded by the run seed (control: does
  removing *any* heads of that count hurt as much).
The controls run at the headline fraction, the mean-ablation at every fraction (the curve). The
suite: the tasks of jobs/data/fewshot.py (token F1) plus next-symbol accuracy on held-out
automata (`regbench_acc`); each drop is clean minus ablated, averaged over tasks with equal weight.
The rise in held-out RegBench TVD (`regbench_tvd`, the paper's metric) is measured alongside.

Every fraction of `eval.ablation.fractions` is measured in this one job and `fraction` gives the
headline metrics: eval settings are part of the run identity, so sweeping `eval.ablation.fraction`
would retrain every model, while making them non-semantic would let results of different
fractions overwrite each other under one run id. Drops and rises are marked lower-is-better only
to orient the comparison words: a smaller drop means a model leans less on those heads.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from common.metrics import CurveSpec, MetricSpec
from config.evals import AblationSettings, InductionSettings, RegBenchSettings, eval_settings
from config.run import JobConfig
from jobs.backends import load_model
from jobs.contract import JobResult, Progress
from jobs.data import train_stream
from jobs.data.fewshot import TASKS, suite, task_f1
from jobs.data.regbench import regbench_data
from jobs.evals import evaluation
from jobs.evals.induction import head_table, repeated_sequences, top_heads
from jobs.evals.regbench import evaluate
from jobs.interp import head_means, replace_heads
from jobs.model import Decoder


CONDITIONS = {"mean": "", "zero": "_zero", "random": "_random"}  # metric suffixes
CONDITION_LABELS = {"": "top heads mean-ablated", "_zero": "top heads zero-ablated (control)",
                    "_random": "random heads mean-ablated (control)"}
REGBENCH_TASK = "regbench_acc"
# Drops and rises measure an effect: higher = the model relies more on the ablated heads (the
# paper's claim for grown and looped models), compared as "higher".
EFFECT = "higher = relies more on the ablated heads; compared as higher"


CLAIM = "ablating the top induction heads costs grown and looped models more few-shot score"
METRICS = {
    "fewshot_f1": MetricSpec("few-shot score, clean", higher_is_better=True),
    "ablation_heads": MetricSpec("heads ablated"),
    "ablation_drop_f1": MetricSpec(f"few-shot drop, {CONDITION_LABELS['']}", higher_is_better=True, effect=EFFECT,
                                   confirmatory_for=("regbench",), claim=CLAIM,
                                   paper=(("dense", 0.08), ("lidas", 0.18), ("looped", 0.28)),
                                   paper_at="3B: mean F1 over 19 tasks, top 20% ablated"),
    **{f"ablation_drop_f1{suffix}": MetricSpec(f"few-shot drop, {label}", higher_is_better=True, effect=EFFECT)
       for suffix, label in CONDITION_LABELS.items() if suffix},
    **{f"ablation_tvd_rise{suffix}": MetricSpec(f"held-out TVD rise, {label}", higher_is_better=True, effect=EFFECT)
       for suffix, label in CONDITION_LABELS.items()},
    **{f"ablation_drop_{task}": MetricSpec(f"drop on {task}, top heads mean-ablated", higher_is_better=True,
                                           effect=EFFECT) for task in (*TASKS, REGBENCH_TASK)},
}
CURVES = {"ablation_by_fraction": CurveSpec(
    "Drop by ablated fraction", "table", x="fraction", columns=("heads", "drop_f1", "tvd_rise"),
    caption="Mean-ablation of the top heads at each fraction of eval.ablation.fractions, mean over seeds.")}


def head_count(fraction: float, n_heads: int) -> int:
    """Heads ablated at `fraction` of `n_heads` head applications: rounded, at least one."""
    return max(1, min(n_heads, round(fraction * n_heads)))


class Suite:
    """Per-item scores of the few-shot tasks and held-out RegBench for one model state."""

    def __init__(self, model: Decoder, cfg: JobConfig):
        self.model, self.cfg = model, cfg
        self.tasks = suite(eval_settings(cfg.eval, "ablation", AblationSettings).prompts, cfg.data.seed)

    def scores(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], float]:
        """(per-item task scores, their weights summing to 1 per task, held-out TVD)."""
        scores = {task.name: task_f1(self.model, task) for task in self.tasks}
        weights = {name: np.full(len(value), 1 / len(value)) for name, value in scores.items()}
        device = next(self.model.parameters()).device
        held_out = evaluate(regbench_data(self.cfg.data), eval_settings(self.cfg.eval, "regbench", RegBenchSettings),
                            lambda inputs: self.model(inputs.to(device)))
        assert held_out.items is not None, "the regbench evaluation records its per-item scores"
        acc = held_out.items[held_out.items["metric"] == REGBENCH_TASK]
        scores[REGBENCH_TASK] = acc["score"].to_numpy()
        weights[REGBENCH_TASK] = acc["weight"].to_numpy() / acc["weight"].sum()
        return scores, weights, held_out.metrics["regbench_tvd"]


def _mean_score(scores: dict[str, np.ndarray], weights: dict[str, np.ndarray]) -> float:
    return float(np.mean([(scores[name] * weights[name]).sum() for name in scores]))


def score(model: Decoder, cfg: JobConfig) -> JobResult:
    # The run's seed, not its data seed, even for the reference batch: it is measuring data (a batch
    # past the last training step), drawn alike for every init and data seed (jobs/evals/__init__.py).
    settings, seed = eval_settings(cfg.eval, "ablation", AblationSettings), cfg.seed
    induction = eval_settings(cfg.eval, "induction", InductionSettings)
    table = head_table(model, repeated_sequences(induction.sequences, induction.length, seed))
    shape = (len(model.plan), int(table["head"].max()) + 1)
    reference, _ = train_stream(cfg.data, seed, settings.reference_batch).batch(cfg.train.steps)
    means = head_means(model, reference)
    values = {"mean": means, "zero": torch.zeros_like(means), "random": means}
    suite_ = Suite(model, cfg)
    clean, weights, clean_tvd = suite_.scores()
    clean_f1 = _mean_score(clean, weights)

    fractions = sorted(set(settings.fractions) | {settings.fraction})
    order = np.random.default_rng([seed, 6]).permutation(len(table))
    curve: dict[str, list] = {"fraction": fractions, "heads": [], "drop_f1": [], "tvd_rise": []}
    metrics: dict[str, float] = {"fewshot_f1": clean_f1}
    items = None
    for fraction in fractions:
        count = head_count(fraction, len(table))
        curve["heads"].append(count)
        top = top_heads(table, count).index.to_numpy()
        picks = {"mean": top, "zero": top, "random": order[:count]}
        headline = fraction == settings.fraction
        for condition, suffix in CONDITIONS.items() if headline else [("mean", "")]:
            chosen = torch.zeros(shape[0] * shape[1], dtype=torch.bool)
            chosen[torch.as_tensor(picks[condition].copy())] = True  # table rows: (application, head) in order
            with replace_heads(model, chosen.view(shape), values[condition]):
                ablated, _, tvd = suite_.scores()
            drop, rise = clean_f1 - _mean_score(ablated, weights), tvd - clean_tvd
            if condition == "mean":
                curve["drop_f1"].append(drop)
                curve["tvd_rise"].append(rise)
            if not headline:
                continue
            metrics |= {f"ablation_drop_f1{suffix}": drop, f"ablation_tvd_rise{suffix}": rise}
            if condition == "mean":
                metrics["ablation_heads"] = float(count)
                metrics |= {f"ablation_drop_{name}": float(((clean[name] - ablated[name]) * weights[name]).sum())
                            for name in clean}
                # weights sum to 1 per task, so the weighted item mean over tasks is the metric
                items = pd.DataFrame({
                    "item_id": [f"{name}.{i}" for name in clean for i in range(len(clean[name]))],
                    "metric": "ablation_drop_f1",
                    "score": np.concatenate([clean[name] - ablated[name] for name in clean]),
                    "weight": np.concatenate([weights[name] for name in clean])})
    return JobResult(metrics=metrics, curves={"ablation_by_fraction": curve}, items=items)


# Revision 2: the held-out TVD is the paper's (jobs/evals/regbench.py) and the held-out accuracy
# task is scored at the reference code's positions.
@evaluation("ablation", title="Head ablation", metrics=METRICS, curves=CURVES, revision=2)
def ablation(cfg: JobConfig, run_dir: Path, progress: Progress) -> JobResult:
    """The registered job: the final checkpoint, clean and with heads ablated."""
    return score(load_model(cfg, run_dir), cfg)
