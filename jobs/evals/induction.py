"""Induction-head scores (prefix matching on repeated random sequences) and, for LIDAS, how the
top heads concentrate on the heads of the initial network they descend from (paper-spec 3.3, 3.5).

Sequences are ``|`` + s + ``|`` + s with s a random arrangement of distinct symbols: the
vocabulary is small, so distinct tokens keep exactly one earlier occurrence per token of the
second copy. Heads are scored per application (a looped block's head once per loop).
"""
from __future__ import annotations

import math
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from jobs.checkpoint import load_model
from jobs.data.regbench import N_SYMBOLS, SEP
from jobs.interp import attention_patterns, induction_scores
from jobs.model import Decoder
from jobs.registry import JobResult, Progress, evaluation

_EXACT_LIMIT = 200_000  # enumerate every top-k set up to this many, else sample
_DRAWS = 20_000


def repeated_sequences(n: int, length: int, seed: int) -> torch.Tensor:
    """[n, 2 * length + 2] token ids: ``|`` s ``|`` s, s = `length` distinct random symbols."""
    rng = np.random.default_rng([seed, 4])
    s = np.argsort(rng.random((n, N_SYMBOLS)), axis=1)[:, :length]
    sep = np.full((n, 1), SEP)
    return torch.from_numpy(np.concatenate([sep, s, sep, s], axis=1))


def head_table(model: Decoder, tokens: torch.Tensor) -> pd.DataFrame:
    """One row per (application, head): layer, iteration (its application count so far), the
    initial-network layer it descends from, and its score."""
    scores = induction_scores(attention_patterns(model, tokens), tokens).numpy()
    plan = model.plan
    iteration = [plan[:step].count(layer) for step, layer in enumerate(plan)]
    heads = scores.shape[1]
    return pd.DataFrame({"application": np.repeat(np.arange(len(plan)), heads),
                         "layer": np.repeat(plan, heads), "iteration": np.repeat(iteration, heads),
                         "head": np.tile(np.arange(heads), len(plan)),
                         "ancestor": np.repeat([model.ancestors[i] for i in plan], heads),
                         "score": scores.ravel().astype(float)})


def top_heads(table: pd.DataFrame, k: int) -> pd.DataFrame:
    """The k highest-scoring rows; ties keep plan order (stable)."""
    return table.sort_values("score", ascending=False, kind="stable").head(k)


def concentration(groups: np.ndarray, chosen: np.ndarray, m: int) -> int:
    """Heads of `chosen` (indices into `groups`) descending from their m most common ancestors."""
    return int(np.sort(np.bincount(groups[chosen], minlength=groups.max() + 1))[::-1][:m].sum())


def concentration_test(groups: np.ndarray, chosen: np.ndarray, m: int, seed: int) -> tuple[int, float, float]:
    """(statistic, chance mean, p): P(statistic >= observed) when the top-k set is drawn uniformly
    from all heads; exact by enumeration when feasible, else a seeded permutation p-value."""
    observed, k, n = concentration(groups, chosen, m), len(chosen), len(groups)
    if math.comb(n, k) <= _EXACT_LIMIT:
        null = np.array([concentration(groups, np.array(c), m) for c in combinations(range(n), k)])
        return observed, float(null.mean()), float((null >= observed).mean())
    rng = np.random.default_rng([seed, 5])
    null = np.array([concentration(groups, rng.choice(n, k, replace=False), m) for _ in range(_DRAWS)])
    return observed, float(null.mean()), float((1 + (null >= observed).sum()) / (1 + _DRAWS))


def score(model: Decoder, cfg: dict) -> JobResult:
    settings = cfg["eval"]["induction"]
    k = min(int(settings["top_k"]), len(model.plan) * model.layers[0].attn.n_heads)
    tokens = repeated_sequences(int(settings["sequences"]), int(settings["length"]), int(cfg["seed"]))
    table = head_table(model, tokens)
    top = top_heads(table, k)
    by_head = table.groupby(["layer", "head"])["score"]
    metrics = {"induction_max": float(table["score"].max()), "induction_topk_mean": float(top["score"].mean()),
               "induction_mean": float(table["score"].mean()),
               "induction_iter_mean_max": float(by_head.mean().max())}
    higher = dict.fromkeys(metrics, True)
    if cfg["family"]["name"] == "lidas":
        ancestor_head = table["ancestor"].to_numpy() * (table["head"].max() + 1) + table["head"].to_numpy()
        stat, chance, p = concentration_test(ancestor_head, top.index.to_numpy(), int(settings["ancestors_m"]),
                                             int(cfg["seed"]))
        metrics |= {"ancestry_top_in_best": float(stat), "ancestry_chance": chance, "ancestry_p": p}
        higher["ancestry_top_in_best"] = True
    curve = {column: table[column].tolist() for column in table.columns}
    items = pd.DataFrame({"item_id": table["application"].astype(str) + "." + table["head"].astype(str),
                          "metric": "induction_head_score", "score": table["score"], "weight": 1.0})
    return JobResult(metrics=metrics, higher_is_better=higher, curves={"induction_heads": curve}, items=items)


@evaluation("induction", metrics=("induction_max", "induction_topk_mean", "ancestry_top_in_best"))
def induction(cfg: dict, run_dir: Path, progress: Progress) -> JobResult:
    """The registered job: the final checkpoint's heads on repeated random sequences."""
    return score(load_model(cfg, run_dir), cfg)
