"""Induction-head scores (prefix matching on repeated random sequences) and, for LIDAS, how the
top heads concentrate on the heads of the initial network they descend from (paper-spec 3.3, 3.5).

Sequences are ``|`` + s + ``|`` + s with s a random arrangement of distinct symbols: the
vocabulary is small, so distinct tokens keep exactly one earlier occurrence per token of the
second copy. This is the literature's probe (Olsson et al. 2022), and `induction_max` on it is the
criterion for "formed induction heads": it is token-agnostic, as the circuit is, and it separates
models with and without the circuit cleanly (docs/miniature.md). The in-distribution probe
(`induction_id_*`) repeats a random walk of a held-out automaton instead, so symbols repeat as
in the data; a head attending to likely successors scores on it without matching anything, so
it is shown beside its chance level, not used as the criterion. Heads are scored per application
(a looped block's head once per loop).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from itertools import combinations
from pathlib import Path
from typing import cast

import numpy as np
import pandas as pd
import torch

from common.metrics import CurveSpec, MetricSpec
from config.evals import InductionSettings, eval_settings
from config.run import JobConfig
from jobs.backends import load_model
from jobs.contract import JobResult, Progress
from jobs.data.regbench import N_SYMBOLS, SEP, heldout_walks, regbench_data
from jobs.evals import evaluation
from jobs.interp import attention_patterns, induction_scores, induction_targets
from jobs.model import Block, Decoder


_EXACT_LIMIT = 200_000  # enumerate every top-k set up to this many, else sample
_DRAWS = 20_000
# 2: added the in-distribution probe (induction_id_max, induction_id_chance).
# 3: ancestry_top_in_best labelled as the count it is; added ancestry_min_p (the test's power).
REVISION = 3
# A family formed induction heads when the median of its seeds' induction_max reaches this: models
# without the circuit score 0.07-0.18 here, with it 0.57-0.90 (docs/miniature.md).
INDUCTION_FORMED = 0.5


METRICS = {
    "induction_max": MetricSpec("best induction-head score", higher_is_better=True, confirmatory_for=("regbench",),
                                claim="grown and looped models form stronger induction heads",
                                mechanism="induction heads", present_at=INDUCTION_FORMED),
    "induction_topk_mean": MetricSpec("mean score of the top induction heads", higher_is_better=True),
    "induction_mean": MetricSpec("mean induction score over all heads", higher_is_better=True),
    "induction_iter_mean_max": MetricSpec("best head's score averaged over its applications", higher_is_better=True),
    "induction_id_max": MetricSpec("best induction-head score, in-distribution probe (repeated walks of held-out"
                                   " automata)", higher_is_better=True),
    "induction_id_chance": MetricSpec("in-distribution probe: the score of a head attending evenly to the past"),
    # ancestry: of the top-k heads, how many (a count, 0..k) descend from their m most common ancestor
    # heads of the initial network, against top-k sets drawn uniformly from all heads (exact p); the
    # smallest p any top-k set could reach says whether the test has power at this size at all
    "ancestry_top_in_best": MetricSpec("top-k heads from their m most common ancestor heads (a count; grown models)",
                                       higher_is_better=True),
    "ancestry_chance": MetricSpec("the same count, by chance (grown models)"),
    "ancestry_min_p": MetricSpec("smallest p the ancestry test can reach here (>= 0.05: it has no power)"),
    "ancestry_p": MetricSpec("ancestry concentration p (grown models)", p_value=True,
                             companions=("ancestry_top_in_best", "ancestry_chance", "ancestry_min_p"),
                             claim="a grown model's strongest induction heads descend from a few early heads",
                             paper=(("lidas", 10),), paper_at="3B: of the top 12 heads, from 2 ancestors"),
}
CURVES = {"induction_heads": CurveSpec(
    "Top induction heads per run", "ranking", y="score", top=3, row="{label} {score:.4g}",
    caption="Top heads per run by prefix-matching score (attention mass from the second copy of a"
            " repeated random sequence onto the token after the earlier occurrence; 1 = a perfect"
            " induction head). A looped block's heads are scored per application (it), a grown"
            " model's heads name the initial layer they descend from.")}


def repeated_sequences(n: int, length: int, seed: int) -> torch.Tensor:
    """[n, 2 * length + 2] token ids: ``|`` s ``|`` s, s = `length` distinct random symbols."""
    rng = np.random.default_rng([seed, 4])
    s = np.argsort(rng.random((n, N_SYMBOLS)), axis=1)[:, :length]
    sep = np.full((n, 1), SEP)
    return torch.from_numpy(np.concatenate([sep, s, sep, s], axis=1))


def in_distribution_sequences(cfg: JobConfig, n: int, length: int, seed: int) -> torch.Tensor:
    """[n, 2 * length + 2] token ids: ``|`` s ``|`` s, s a random walk of `length` symbols of
    held-out automaton i (symbols repeat, as in the data)."""
    s = heldout_walks(regbench_data(cfg.data), n, length, np.random.default_rng([seed, 6]))
    sep = np.full((n, 1), SEP)
    return torch.from_numpy(np.concatenate([sep, s, sep, s], axis=1))


def even_attention_score(tokens: torch.Tensor) -> float:
    """The induction score of a head that attends evenly to every position up to its own."""
    target = induction_targets(tokens).to(torch.float64)
    rows = target.sum(-1) > 0
    even = target.sum(-1) / torch.arange(1, tokens.shape[1] + 1)
    return float(even[rows].mean())


def head_table(model: Decoder, tokens: torch.Tensor) -> pd.DataFrame:
    """One row per (application, head): layer, iteration (its application count so far), the
    initial-network layer it descends from, and its score."""
    scores = induction_scores(attention_patterns(model, tokens), tokens).numpy()
    plan = model.plan
    iteration = [plan[:step].count(layer) for step, layer in enumerate(plan)]
    heads = scores.shape[1]
    table = pd.DataFrame({"application": np.repeat(np.arange(len(plan)), heads),
                          "layer": np.repeat(plan, heads), "iteration": np.repeat(iteration, heads),
                          "head": np.tile(np.arange(heads), len(plan)),
                          "ancestor": np.repeat([model.ancestors[i] for i in plan], heads),
                          "score": scores.ravel().astype(float)})
    return table.assign(label=head_labels(table))


def head_labels(table: pd.DataFrame) -> list[str]:
    """Each head as the report names it: `L<layer>.H<head>`, with `it<i>` for the applications of
    a looped block and `(from L<ancestor>)` for the heads of a network that grew."""
    looped, grown = table["iteration"].max() > 0, bool((table["ancestor"] != table["layer"]).any())
    return [f"L{r.layer}.H{r.head}" + (f" it{r.iteration}" if looped else "")
            + (f" (from L{r.ancestor})" if grown else "") for r in table.itertuples()]


def grown(model: Decoder) -> bool:
    """Whether some layers were copied from others (a LIDAS network that grew)."""
    return len(set(model.ancestors)) < len(model.ancestors)


def top_heads(table: pd.DataFrame, k: int) -> pd.DataFrame:
    """The k highest-scoring rows; ties keep plan order (stable)."""
    return table.sort_values("score", ascending=False, kind="stable").head(k)


def concentration(groups: np.ndarray, chosen: np.ndarray, m: int) -> int:
    """Heads of `chosen` (indices into `groups`) descending from their m most common ancestors."""
    return int(np.sort(np.bincount(groups[chosen], minlength=groups.max() + 1))[::-1][:m].sum())


def subset_test(statistic: Callable[[np.ndarray], int], n: int, chosen: np.ndarray,
                seed: int) -> tuple[int, float, float]:
    """(statistic of `chosen`, its chance mean, p): P(statistic >= observed) when the k = len(chosen)
    rows are drawn uniformly from all n; exact by enumeration when feasible, else a seeded
    permutation p-value."""
    observed, k = statistic(chosen), len(chosen)
    if math.comb(n, k) <= _EXACT_LIMIT:
        null = np.array([statistic(np.array(c)) for c in combinations(range(n), k)])
        return observed, float(null.mean()), float((null >= observed).mean())
    rng = np.random.default_rng([seed, 5])
    null = np.array([statistic(rng.choice(n, k, replace=False)) for _ in range(_DRAWS)])
    return observed, float(null.mean()), float((1 + (null >= observed).sum()) / (1 + _DRAWS))


def concentration_test(groups: np.ndarray, chosen: np.ndarray, m: int, seed: int) -> tuple[int, float, float]:
    """`subset_test` of the concentration: do the top-k heads descend from few ancestor heads?"""
    return subset_test(lambda c: concentration(groups, c, m), len(groups), chosen, seed)


def most_concentrated(groups: np.ndarray, k: int) -> np.ndarray:
    """k heads whose concentration is the largest any k heads reach (at every m): whole groups,
    largest first, so its p is the smallest the test can give."""
    sizes = np.bincount(groups)
    return np.lexsort((groups, -sizes[groups]))[:k]


def ancestor_heads(table: pd.DataFrame) -> np.ndarray:
    """Each row's ancestor head (its initial-network layer and head index), as one integer."""
    return table["ancestor"].to_numpy() * (table["head"].max() + 1) + table["head"].to_numpy()


def ancestry(table: pd.DataFrame, top: pd.DataFrame, m: int, seed: int) -> tuple[int, float, float]:
    """(count, chance, p) of the concentration of the `top` rows of `table` on their m most common
    ancestor heads."""
    return concentration_test(ancestor_heads(table), top.index.to_numpy(), m, seed)


def ancestry_floor(table: pd.DataFrame, k: int, m: int, seed: int) -> float:
    """The smallest p `ancestry` can give for k top heads of `table`: at or above the level, the
    test cannot find a concentration however strong (too few heads, or too few copies of each)."""
    groups = ancestor_heads(table)
    return concentration_test(groups, most_concentrated(groups, k), m, seed)[2]


def score(model: Decoder, cfg: JobConfig) -> JobResult:
    settings = eval_settings(cfg.eval, "induction", InductionSettings)
    heads = cast(Block, model.layers[0]).attn.n_heads  # a ModuleList's items are typed Module; these are Blocks
    k = min(settings.top_k, len(model.plan) * heads)
    tokens = repeated_sequences(settings.sequences, settings.length, cfg.seed)
    table = head_table(model, tokens)
    top = top_heads(table, k)
    by_head = table.groupby(["layer", "head"])["score"]
    metrics = {"induction_max": float(table["score"].max()), "induction_topk_mean": float(top["score"].mean()),
               "induction_mean": float(table["score"].mean()),
               "induction_iter_mean_max": float(by_head.mean().max())}
    walks = in_distribution_sequences(cfg, settings.sequences, settings.length, cfg.seed)
    metrics |= {"induction_id_max": float(induction_scores(attention_patterns(model, walks), walks).max()),
                "induction_id_chance": even_attention_score(walks)}
    if grown(model):
        count, chance, p = ancestry(table, top, settings.ancestors_m, cfg.seed)
        metrics |= {"ancestry_top_in_best": float(count), "ancestry_chance": chance, "ancestry_p": p,
                    "ancestry_min_p": ancestry_floor(table, k, settings.ancestors_m, cfg.seed)}
    curve = {column: table[column].tolist() for column in table.columns}
    items = pd.DataFrame({"item_id": table["application"].astype(str) + "." + table["head"].astype(str),
                          "metric": "induction_head_score", "score": table["score"], "weight": 1.0})
    return JobResult(metrics=metrics, curves={"induction_heads": curve}, items=items)


@evaluation("induction", title="Induction heads", metrics=METRICS, curves=CURVES, revision=REVISION)
def induction(cfg: JobConfig, run_dir: Path, progress: Progress) -> JobResult:
    """The registered job: the final checkpoint's heads on repeated random sequences."""
    return score(load_model(cfg, run_dir), cfg)
