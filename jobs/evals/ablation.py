"""Head ablation (paper-spec 3.4, 4): how much the few-shot tasks and held-out RegBench rely on
the strongest induction heads.

Heads are ranked by the induction eval's prefix-matching score (a looped block's head once per
application) on its probe, repeated random sequences seeded by the run seed (the *picking* split,
`picking_probe`). The top heads have their per-head output, o_proj's input, replaced at every
position by
- its mean over a reference batch of training-distribution RegBench instances (mean-ablation, the
  measured effect),
- zero (control: how much of the effect is the mere shift off the mean),
- or the same is done to as many heads drawn at random from the heads outside the top set that
  are no induction heads, matched by layer (`random_heads`), seeded by the run seed (control: does
  removing any other heads of that count at those depths hurt as much).

The *scoring* split is held out from the picking: the tasks of jobs/data/fewshot.py (token F1),
whose prompts come from their own seed stream of the data seed ([data seed, 7, task], against the
probe's [run seed, 4]; the copy task's prompts have the probe's form, so this is what keeps it from
scoring the heads on the sequences they were picked on), plus next-symbol accuracy on the held-out
automata (`regbench_acc`), which the picking never sees. Each drop is clean minus ablated, averaged
over the tasks with equal weight. The rise in held-out RegBench TVD (`regbench_tvd`, the paper's
metric) is measured alongside.

Three views, one job:
- headline (`fraction`): the top fraction of head applications, with both controls;
- the fraction curve (`fractions`): mean-ablation only, a table in the report;
- graded (`ks`): the top k heads for each k, with the random control, as metrics suffixed `_k<k>`
  and a line per family in the report. A k above the model's head applications ablates all of them
  (the curve's `heads` says how many); the control at k needs k heads in its pool, so it is not
  recorded where fewer remain (k above half the heads, less the induction heads outside the top
  k). k is one of config/evals.py's ABLATION_KS, for which the metrics are declared.

The fractions are measured in one job because `fraction` and `fractions` are part of the run id
(format 1): sweeping `eval.ablation.fraction` would retrain every model, while making them
non-semantic would let results of different fractions overwrite each other under one run id; `ks`,
added since, is outside the id and recorded with the results, so changing it reruns this
evaluation only. Each distinct set of ablated heads is measured once however many views name it.
Drops and rises are effects, compared as "higher": a larger drop means a model relies more on the
ablated heads.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from common.metrics import CurveSpec, MetricSpec
from config.evals import ABLATION_KS, AblationSettings, InductionSettings, RegBenchSettings, eval_settings
from config.run import JobConfig
from jobs.backends import load_model
from jobs.contract import JobResult, Progress
from jobs.data import train_stream
from jobs.data.fewshot import TASKS, suite, task_f1
from jobs.data.regbench import regbench_data
from jobs.evals import evaluation
from jobs.evals.induction import INDUCTION_FORMED, head_table, repeated_sequences, top_heads
from jobs.evals.regbench import evaluate
from jobs.interp import head_means, replace_heads
from jobs.model import Decoder


CONDITION_LABELS = {"": "top heads mean-ablated", "_zero": "top heads zero-ablated (control)",
                    "_random": "random heads mean-ablated (control)"}
REGBENCH_TASK = "regbench_acc"
# Drops and rises measure an effect: higher = the model relies more on the ablated heads (the
# paper's claim for grown and looped models), compared as "higher".
EFFECT = "higher = relies more on the ablated heads; compared as higher"


def _effect(label: str) -> MetricSpec:
    return MetricSpec(label, higher_is_better=True, effect=EFFECT)


CLAIM = "ablating the top induction heads costs grown and looped models more few-shot score"
METRICS = {
    "fewshot_f1": MetricSpec("few-shot score, clean", higher_is_better=True),
    "ablation_heads": MetricSpec("heads ablated"),
    "ablation_drop_f1": MetricSpec(f"few-shot drop, {CONDITION_LABELS['']}", higher_is_better=True, effect=EFFECT,
                                   confirmatory_for=("regbench",), claim=CLAIM,
                                   paper=(("dense", 0.08), ("lidas", 0.18), ("looped", 0.28)),
                                   paper_at="3B: mean F1 over 19 tasks, top 20% ablated"),
    **{f"ablation_drop_f1{suffix}": _effect(f"few-shot drop, {label}") for suffix, label in CONDITION_LABELS.items()
       if suffix},
    **{f"ablation_tvd_rise{suffix}": _effect(f"held-out TVD rise, {label}")
       for suffix, label in CONDITION_LABELS.items()},
    **{f"ablation_drop_{task}": _effect(f"drop on {task}, top heads mean-ablated") for task in (*TASKS, REGBENCH_TASK)},
    **{f"ablation_{what}{suffix}_k{k}": _effect(f"{label}, {heads.format(k=k, s='s' if k > 1 else '')}")
       for k in ABLATION_KS for what, label in (("drop_f1", "few-shot drop"), ("tvd_rise", "held-out TVD rise"))
       for suffix, heads in (("", "top {k} head{s} mean-ablated"),
                             ("_random", "{k} random other head{s} mean-ablated (control)"))},
}
CURVES = {
    "ablation_by_fraction": CurveSpec(
        "Drop by ablated fraction", "table", x="fraction", columns=("heads", "drop_f1", "tvd_rise"),
        caption="Mean-ablation of the top heads at each fraction of eval.ablation.fractions, mean over seeds."),
    "ablation_by_k": CurveSpec(
        "Few-shot drop by number of ablated heads", "line", x="k", x_label="k: top heads by induction score ablated",
        y="ablation_drop_f1", references=("ablation_drop_f1_random",),
        caption="Mean-ablation of the top k heads at each k of eval.ablation.ks (a k above a model's head"
                " applications ablates them all), scored on prompts held out from those the heads were picked on."
                " Per family, mean over seeds with band: min-max over seeds; dotted: as many random heads, neither in"
                " the top k nor induction heads, matched by layer, averaged over the runs (absent where fewer"
                " than k such heads remain)."
                " Per-family intervals: the ablation_drop_f1_k<k> tables."),
}


def head_count(fraction: float, n_heads: int) -> int:
    """Heads ablated at `fraction` of `n_heads` head applications: rounded, at least one."""
    return max(1, min(n_heads, round(fraction * n_heads)))


def picking_probe(cfg: JobConfig) -> torch.Tensor:
    """The picking split: the induction eval's probe, repeated random sequences of the run seed's
    stream, on which the heads are ranked. The scored prompts (`Suite`) come from other streams."""
    induction = eval_settings(cfg.eval, "induction", InductionSettings)
    return repeated_sequences(induction.sequences, induction.length, cfg.seed)


def random_heads(table: pd.DataFrame, top: np.ndarray, seed: int) -> np.ndarray | None:
    """The random control of `top` (row labels of the head table): as many rows drawn uniformly
    from the *pool*, the rows outside `top` that are no induction heads (score below
    INDUCTION_FORMED), as many in each application (a layer's place in depth, so a looped block's
    applications count apart) as `top` has there. Induction heads outside `top` are left out because
    with few heads per layer the layer-matched draw would otherwise be the next induction head
    (at two heads per layer, the top head's sibling, often the second induction head). Where an
    application has fewer pool rows than `top` has in it, it gives all it has and the shortfall is
    drawn uniformly from the pool rows left in any application. None when the pool has fewer than
    len(top) rows. Seeded by (seed, len(top))."""
    rng = np.random.default_rng([seed, 6, len(top)])
    pool = table.drop(index=top)
    pool = pool[pool["score"] < INDUCTION_FORMED]
    if len(pool) < len(top):
        return None
    wanted = table.loc[top, "application"].value_counts()
    drawn: list[int] = []
    for application, rows in pool.groupby("application", sort=True):
        n = min(int(wanted.get(application, 0)), len(rows))
        drawn += rng.choice(rows.index.to_numpy(), n, replace=False).tolist()
    rest = pool.index.difference(drawn).to_numpy()
    drawn += rng.choice(rest, len(top) - len(drawn), replace=False).tolist()
    return np.sort(np.array(drawn, dtype=np.int64))


class Suite:
    """Per-item scores of the few-shot tasks and held-out RegBench for one model state: the scoring
    split, prompts of the data seed's few-shot streams and the held-out automata."""

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


class Ablations:
    """The suite with chosen heads replaced, each (replacement, head set) measured once."""

    def __init__(self, model: Decoder, cfg: JobConfig, shape: tuple[int, int]):
        # The run's seed, not its data seed, even for the reference batch: it is measuring data (a
        # batch past the last training step), drawn alike for every init and data seed
        # (jobs/evals/__init__.py).
        settings = eval_settings(cfg.eval, "ablation", AblationSettings)
        reference, _ = train_stream(cfg.data, cfg.seed, settings.reference_batch).batch(cfg.train.steps)
        means = head_means(model, reference)
        self.values = {"mean": means, "zero": torch.zeros_like(means)}
        self.model, self.shape, self.suite = model, shape, Suite(model, cfg)
        self.clean, self.weights, self.clean_tvd = self.suite.scores()
        self.clean_f1 = _mean_score(self.clean, self.weights)
        self.measured: dict[tuple[str, tuple[int, ...]], tuple[dict[str, np.ndarray], float]] = {}

    def scores(self, rows: np.ndarray, value: str = "mean") -> tuple[dict[str, np.ndarray], float]:
        """Per-item scores and held-out TVD with the heads at `rows` of the head table (in order:
        (application, head)) output `value` ("mean" or "zero")."""
        key = (value, tuple(sorted(rows.tolist())))
        if key not in self.measured:
            chosen = torch.zeros(self.shape[0] * self.shape[1], dtype=torch.bool)
            chosen[torch.as_tensor(rows.copy())] = True
            with replace_heads(self.model, chosen.view(self.shape), self.values[value]):
                ablated, _, tvd = self.suite.scores()
            self.measured[key] = (ablated, tvd)
        return self.measured[key]

    def effect(self, rows: np.ndarray, value: str = "mean") -> tuple[float, float]:
        """(drop in the suite's score, rise in held-out TVD)."""
        ablated, tvd = self.scores(rows, value)
        return self.clean_f1 - _mean_score(ablated, self.weights), tvd - self.clean_tvd


def score(model: Decoder, cfg: JobConfig) -> JobResult:
    """The headline metrics with both controls, the fraction curve and the graded metrics."""
    settings, seed = eval_settings(cfg.eval, "ablation", AblationSettings), cfg.seed
    table = head_table(model, picking_probe(cfg))
    ablations = Ablations(model, cfg, (len(model.plan), int(table["head"].max()) + 1))
    metrics: dict[str, float] = {"fewshot_f1": ablations.clean_f1}

    fractions = sorted(set(settings.fractions) | {settings.fraction})
    by_fraction: dict[str, list] = {"fraction": fractions, "heads": [], "drop_f1": [], "tvd_rise": []}
    for fraction in fractions:
        count = head_count(fraction, len(table))
        drop, rise = ablations.effect(top_heads(table, count).index.to_numpy())
        by_fraction["heads"].append(count)
        by_fraction["drop_f1"].append(drop)
        by_fraction["tvd_rise"].append(rise)

    count = head_count(settings.fraction, len(table))
    top = top_heads(table, count).index.to_numpy()
    control = random_heads(table, top, seed)
    for suffix, rows, value in (("", top, "mean"), ("_zero", top, "zero"), ("_random", control, "mean")):
        if rows is not None:
            metrics["ablation_drop_f1" + suffix], metrics["ablation_tvd_rise" + suffix] = ablations.effect(rows, value)
    metrics["ablation_heads"] = float(count)
    clean, weights = ablations.clean, ablations.weights
    ablated, _ = ablations.scores(top)
    metrics |= {f"ablation_drop_{name}": float(((clean[name] - ablated[name]) * weights[name]).sum()) for name in clean}
    # weights sum to 1 per task, so the weighted item mean over tasks is the metric
    items = pd.DataFrame({
        "item_id": [f"{name}.{i}" for name in clean for i in range(len(clean[name]))],
        "metric": "ablation_drop_f1",
        "score": np.concatenate([clean[name] - ablated[name] for name in clean]),
        "weight": np.concatenate([weights[name] for name in clean])})

    ks = sorted(set(settings.ks))
    by_k: dict[str, list] = {"k": ks, "heads": [], "ablation_drop_f1": [], "ablation_drop_f1_random": []}
    for k in ks:
        top = top_heads(table, min(k, len(table))).index.to_numpy()
        metrics[f"ablation_drop_f1_k{k}"], metrics[f"ablation_tvd_rise_k{k}"] = ablations.effect(top)
        control = random_heads(table, top, seed)
        if control is not None:
            metrics[f"ablation_drop_f1_random_k{k}"], metrics[f"ablation_tvd_rise_random_k{k}"] = \
                ablations.effect(control)
        by_k["heads"].append(len(top))
        by_k["ablation_drop_f1"].append(metrics[f"ablation_drop_f1_k{k}"])
        by_k["ablation_drop_f1_random"].append(metrics.get(f"ablation_drop_f1_random_k{k}"))
    return JobResult(metrics=metrics, curves={"ablation_by_fraction": by_fraction, "ablation_by_k": by_k}, items=items)


# Revision 2: the held-out TVD is the paper's (jobs/evals/regbench.py) and the held-out accuracy
# task is scored at the reference code's positions. Revision 3: the random control draws from the
# heads outside the top set, matched by layer (it could draw the top heads themselves); the graded
# metrics (`_k<k>`) are added.
@evaluation("ablation", title="Head ablation", metrics=METRICS, curves=CURVES, revision=3)
def ablation(cfg: JobConfig, run_dir: Path, progress: Progress) -> JobResult:
    """The registered job: the final checkpoint, clean and with heads ablated."""
    return score(load_model(cfg, run_dir), cfg)
