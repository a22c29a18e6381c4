"""The mechanism over training (paper-spec 3.3, 3.5): at every snapshot a run kept (`train.snapshots`,
jobs/train.py `snapshot_steps`), its induction heads on eval.induction's probe, their ancestry in a
network that grew, and, for LIDAS, how far each duplicated layer has moved from its source.

Per snapshot step t, metrics named `<metric>_step<t>` (descriptive: the results tables hold them,
the report draws them as curves over training):
- `induction_max_step<t>`: the best head's score;
- `ancestry_top_in_best_step<t>`, `ancestry_chance_step<t>`, `ancestry_p_step<t>`: the induction
  evaluation's ancestry count, its chance value and p (snapshots of a network that grew);
- `layer_divergence_weight_step<t>`, `layer_divergence_output_step<t>`: per pair of a duplicated
  layer and its source (jobs/families `duplicates`), ||W_copy - W_source|| / ||W_source|| over all
  the layer's parameters, and ||f_copy(h) - f_source(h)|| / ||f_source(h) - h||: both layers applied
  to the residual stream h that the source receives on a fixed batch of `divergence_batch`
  training-distribution sequences (drawn as the ablation's reference batch), relative to the
  source's own update of h (h itself, common to both outputs, would hide the difference); means
  over the pairs. At a growth step's snapshot both are 0 by construction: the copy is exact.

Per run:
- `induction_formed_step`: the first snapshot step with induction_max >= INDUCTION_FORMED (NaN: none);
- `induction_top_kept`: of the last snapshot's top-k heads, the share that were top-k heads at the
  first snapshot where heads had formed, with `induction_top_kept_chance` and the exact
  `induction_top_kept_p` for top-k sets drawn uniformly from the last snapshot's heads; NaN when
  heads had not formed before the last snapshot. A head is (layer, iteration, head index), and a
  layer of a network that grew in between stands for the layer it is or was copied from
  (jobs/families `lineage`): a duplicated layer and its copy both continue their source's heads;
- `layer_divergence_weight`, `layer_divergence_output`: at the last snapshot (the final step).

A run without snapshots (trained before they existed, with train.snapshots=0, or by the nanotron
backend, which keeps none) records nothing.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from common.metrics import CurveSpec, MetricSpec
from config.evals import InductionSettings, MechanismSettings, eval_settings
from config.run import JobConfig
from jobs.checkpoint import snapshots
from jobs.contract import JobResult, Progress
from jobs.data import train_stream
from jobs.evals import evaluation
from jobs.evals.induction import (INDUCTION_FORMED, ancestry, grown, head_table, repeated_sequences, subset_test,
                                  top_heads)
from jobs.families import Family, build_model, family_of
from jobs.interp import layer_calls
from jobs.model import Decoder

X_LABEL = "training step"
METRICS = {
    "induction_max_step{step}": MetricSpec("best induction-head score at step {step}"),
    "ancestry_top_in_best_step{step}": MetricSpec("top-k heads from their m most common ancestor heads at step {step}"
                                                  " (a count; grown models)"),
    "ancestry_chance_step{step}": MetricSpec("the same count by chance at step {step} (grown models)"),
    "ancestry_p_step{step}": MetricSpec("ancestry concentration p at step {step} (grown models)"),
    "layer_divergence_weight_step{step}": MetricSpec("duplicated layers' relative weight distance from their sources"
                                                     " at step {step}"),
    "layer_divergence_output_step{step}": MetricSpec("duplicated layers' relative output difference from their"
                                                     " sources at step {step}"),
    "induction_formed_step": MetricSpec(f"first snapshot step with induction heads (induction_max >="
                                        f" {INDUCTION_FORMED})"),
    "induction_top_kept": MetricSpec("share of the final top-k induction heads that were top-k when heads formed"),
    "induction_top_kept_chance": MetricSpec("the same share, by chance"),
    "induction_top_kept_p": MetricSpec("top heads kept since formation p", p_value=True,
                                       companions=("induction_top_kept", "induction_top_kept_chance"),
                                       claim="the induction circuit that forms early is not displaced later"),
    # at the last snapshot (the final step); unqualified, since they also name the curves' y axes
    "layer_divergence_weight": MetricSpec("duplicated layers' relative weight distance from their sources"),
    "layer_divergence_output": MetricSpec("duplicated layers' relative output difference from their sources"),
}
CURVES = {
    "induction_by_step": CurveSpec(
        "Induction heads over training", "line", x="step", x_label=X_LABEL, y="induction_max",
        caption=f"The best head's prefix-matching score at each snapshot of training (train.snapshots, and"
                f" LIDAS right after each growth); heads have formed from {INDUCTION_FORMED} on."),
    "layer_divergence_weight_by_step": CurveSpec(
        "Duplicated layers: weight distance over training", "line", x="step", x_label=X_LABEL,
        y="layer_divergence_weight",
        caption="||W_copy - W_source|| / ||W_source|| over each duplicated layer's parameters, mean over the"
                " pairs of copy and source; 0 at the growth step that made the copy."),
    "layer_divergence_output_by_step": CurveSpec(
        "Duplicated layers: output difference over training", "line", x="step", x_label=X_LABEL,
        y="layer_divergence_output",
        caption="||f_copy(h) - f_source(h)|| / ||f_source(h) - h|| on the residual stream h the source receives"
                " (a fixed batch of training sequences), mean over the pairs; 0 at the growth step."),
    "heads_by_step": CurveSpec("every head's induction score at every snapshot, and whether it is top-k", "data"),
}


@dataclass(frozen=True)
class Heads:
    """One snapshot's heads: its step, its number of unique layers, every head's score, the top k."""
    step: int
    n_layers: int
    table: pd.DataFrame
    top: pd.DataFrame


def snapshot_model(cfg: JobConfig, state: dict) -> Decoder:
    """The model a snapshot holds, on CPU in eval mode."""
    model = build_model(cfg.family, cfg.model, state["ancestors"])
    model.load_state_dict(state["model"])
    return model.eval()


@torch.no_grad()
def layer_divergence(model: Decoder, pairs: list[tuple[int, int]], tokens: torch.Tensor) -> tuple[float, float]:
    """Means over the (copy, source) pairs of the relative weight distance and the relative output
    difference on the input the source receives (the module's docstring)."""
    calls = layer_calls(model, tokens)
    weights, outputs = [], []
    for copy_, source in pairs:
        w_copy, w_source = (torch.cat([p.flatten() for p in model.layers[i].parameters()]) for i in (copy_, source))
        weights.append(float((w_copy - w_source).norm() / w_source.norm()))
        x, cos, sin = calls[model.plan.index(source)]
        from_source, from_copy = (model.layers[i](x, cos, sin) for i in (source, copy_))
        outputs.append(float((from_copy - from_source).norm() / (from_source - x).norm()))
    return float(np.mean(weights)), float(np.mean(outputs))


def kept_in_top(family: Family, formed: Heads, last: Heads, seed: int) -> tuple[float, float, float]:
    """(share, chance share, p) of `last`'s top heads whose lineage head was top at `formed`."""
    lineage = family.lineage(formed.n_layers, last.n_layers)
    top_then = set(zip(*(formed.top[c].tolist() for c in ("layer", "iteration", "head"))))
    continued = np.array([(lineage[layer], iteration, head) in top_then for layer, iteration, head
                          in zip(*(last.table[c].tolist() for c in ("layer", "iteration", "head")))])
    count, chance, p = subset_test(lambda rows: int(continued[rows].sum()), len(continued),
                                   last.top.index.to_numpy(), seed)
    return count / len(last.top), chance / len(last.top), p


def score(cfg: JobConfig, states: Iterable[dict]) -> JobResult:
    """The metrics and curves of the module's docstring from the snapshots `states`, in step order."""
    induction = eval_settings(cfg.eval, "induction", InductionSettings)
    settings = eval_settings(cfg.eval, "mechanism", MechanismSettings)
    family = family_of(cfg.family)
    probe = repeated_sequences(induction.sequences, induction.length, cfg.seed)
    batch, _ = train_stream(cfg.data, cfg.seed, settings.divergence_batch).batch(cfg.train.steps)
    metrics: dict[str, float] = {}
    seen: list[Heads] = []
    per_step: list[tuple[int, dict[str, float]]] = []
    for state in states:
        model, step = snapshot_model(cfg, state), int(state["step"])
        table = head_table(model, probe)
        top = top_heads(table, min(induction.top_k, len(table)))
        seen.append(Heads(step, len(model.layers), table, top))
        values = {"induction_max": float(table["score"].max())}
        if grown(model):
            count, chance, p = ancestry(table, top, induction.ancestors_m, cfg.seed)
            values |= {"ancestry_top_in_best": float(count), "ancestry_chance": chance, "ancestry_p": p}
        if pairs := family.duplicates(len(model.layers)):
            values["layer_divergence_weight"], values["layer_divergence_output"] = layer_divergence(model, pairs, batch)
        metrics |= {f"{name}_step{step}": value for name, value in values.items()}
        per_step.append((step, values))
    if not seen:
        return JobResult(metrics={})
    last = seen[-1]
    final = {f"{name}_step{last.step}": name for name in ("layer_divergence_weight", "layer_divergence_output")}
    metrics |= {name: metrics[at] for at, name in final.items() if at in metrics}
    formed = [heads for heads in seen if heads.table["score"].max() >= INDUCTION_FORMED]
    metrics["induction_formed_step"] = float(formed[0].step) if formed else float("nan")
    kept = (kept_in_top(family, formed[0], last, cfg.seed) if formed and formed[0] is not last
            else (float("nan"),) * 3)
    metrics |= dict(zip(("induction_top_kept", "induction_top_kept_chance", "induction_top_kept_p"), kept))
    curves = {name: {"step": [step for step, values in per_step if spec.y in values],
                     spec.y: [values[spec.y] for _, values in per_step if spec.y in values]}
              for name, spec in CURVES.items() if spec.kind == "line"}
    heads = pd.concat([h.table.assign(step=h.step, top=h.table.index.isin(h.top.index)) for h in seen])
    return JobResult(metrics=metrics, curves={**{name: curve for name, curve in curves.items() if curve["step"]},
                                              "heads_by_step": {c: heads[c].tolist() for c in heads.columns}})


@evaluation("mechanism", title="The mechanism over training", metrics=METRICS, curves=CURVES)
def mechanism(cfg: JobConfig, run_dir: Path, progress: Progress) -> JobResult:
    """The registered job: every snapshot the run kept (jobs/checkpoint.py `snapshots`)."""
    return score(cfg, snapshots(run_dir))
