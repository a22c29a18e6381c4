"""RegBench scoring: a model's next-symbol distributions against the true PFA ones,
next to in-context n-gram estimators as reference rows.

All metrics pool positions (every valid position of every instance weighs the same),
as the reference code does. A model that does not beat ``ngram1`` learned no in-context
learning; ``ngram2``/``ngram3`` show what counting short contexts already achieves.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
import torch

from common.metrics import CurveSpec, MetricSpec
from common.settings import setting
from jobs.contract import JobResult, Progress
from jobs.data.regbench import N_SYMBOLS, SEP, VOCAB, DataSpec, EvalSet, RegBenchConfig, heldout_set
from jobs.evals import evaluation

if TYPE_CHECKING:  # type hints only: jobs.config imports the packages that define the sections
    from jobs.config import JobConfig

NGRAM_ORDERS = (1, 2, 3)
_NGRAM_BATCH = 50  # instances per chunk of n-gram counting (bounds memory only)
ITEM_METRICS = ("regbench_tvd", "regbench_l1_ref", "regbench_acc") + tuple(f"ngram{n}_tvd" for n in NGRAM_ORDERS)
NGRAM_NAMES = {1: "in-context unigram", 2: "in-context bigram", 3: "in-context trigram"}
SCORES = {"tvd": ("TVD", False), "l1_ref": ("L1 (reference-code convention)", False), "acc": ("accuracy", True)}


@dataclass
class RegBenchSettings:
    """eval.regbench: the held-out instances scored (one per held-out automaton, cycled)."""
    instances: int = setting(gt=0)
    ngram_alpha: float = setting(gt=0)  # add-alpha smoothing of the in-context n-gram estimators
    batch_size: int = setting(gt=0)


METRICS = {
    "regbench_tvd": MetricSpec("RegBench TVD", higher_is_better=False, headline_for=("regbench",),
                               confirmatory_for=("regbench",),
                               claim="grown and looped models learn in context better: lower held-out TVD",
                               paper=(("lidas", 0.119), ("looped", 0.125), ("dense", 0.137)), paper_at="3B",
                               references=tuple(f"ngram{n}_tvd" for n in NGRAM_ORDERS),
                               below_first="it learned no in-context learning"),
    "regbench_l1_ref": MetricSpec("RegBench L1 (reference-code convention)", higher_is_better=False),
    "regbench_acc": MetricSpec("RegBench accuracy", higher_is_better=True),
    **{f"ngram{n}_{score}": MetricSpec(NGRAM_NAMES[n] + ("" if score == "tvd" else f" ({label})"),
                                       higher_is_better=higher, reference=True)
       for n in NGRAM_ORDERS for score, (label, higher) in SCORES.items()},
}
CURVES = {"tvd_by_context": CurveSpec(
    "RegBench TVD by number of in-context strings", "line", x="n_context_strings",
    x_label="strings of the instance's language already in the context", y="regbench_tvd",
    references=tuple(f"ngram{n}_tvd" for n in NGRAM_ORDERS), count="n_positions",
    caption="Per family, mean over seeds with band: min-max over seeds; dashed and dotted: the in-context"
            " n-gram estimators on the same positions; below: positions evaluated per point (few at the"
            " right end, which is therefore noisy).")}


def position_scores(p_symbols: np.ndarray, p_vocab: np.ndarray, ref: np.ndarray,
                    allowed: np.ndarray) -> dict[str, np.ndarray]:
    """Per-position scores ``[..]`` of predicted distributions.

    tvd: 1/2 L1 of the distribution given that the string continues (18 symbols);
    l1_ref: the reference code's sum of |p - true| over the whole vocabulary (true = 0
    at ``|`` and pad); acc: whether the vocabulary argmax is an allowed symbol, with ties
    split evenly (expected accuracy under random tie-breaking, which matters for the
    flat predictions of n-gram estimators on unseen contexts).
    """
    is_max = p_vocab >= p_vocab.max(axis=-1, keepdims=True)
    return {
        "tvd": 0.5 * np.abs(p_symbols - ref).sum(axis=-1),
        "l1_ref": np.abs(p_vocab[..., :N_SYMBOLS] - ref).sum(axis=-1) + p_vocab[..., N_SYMBOLS:].sum(axis=-1),
        "acc": (is_max[..., :N_SYMBOLS] & allowed).sum(axis=-1) / is_max.sum(axis=-1),
    }


def _context_ids(inputs: np.ndarray, width: int) -> np.ndarray:
    """Id of the last ``width`` tokens of the current string, left-filled with ``|``: strings
    are independent walks, so contexts never reach into the previous string."""
    length = inputs.shape[1]
    position = np.arange(length)
    last_sep = np.maximum.accumulate(np.where(inputs == SEP, position, 0), axis=1)
    ids = np.zeros_like(inputs)
    for back in range(width):
        shifted = np.pad(inputs, ((0, 0), (back, 0)), constant_values=SEP)[:, :length]
        ids = ids * VOCAB + np.where(back < position - last_sep, shifted, SEP)
    return ids


def ngram_distributions(inputs: np.ndarray, order: int, alpha: float) -> np.ndarray:
    """In-context add-alpha n-gram predictions ``[N, T, 18]``.

    At position p, count the symbols that followed earlier occurrences of p's context
    (the n-1 preceding tokens, ``|`` included) within the instance's prefix up to p.
    Counts are exclusive cumulative sums within groups of equal (instance, context).
    """
    n_rows, length = inputs.shape
    follower = np.zeros((n_rows, length, N_SYMBOLS), dtype=np.int32)
    row, position = np.nonzero(inputs[:, 1:] < N_SYMBOLS)
    follower[row, position, inputs[row, position + 1]] = 1

    key = (np.arange(n_rows)[:, None] * VOCAB ** (order - 1) + _context_ids(inputs, order - 1)).ravel()
    by_group = np.argsort(key, kind="stable")  # stable: time order inside each group
    sorted_follower = follower.reshape(-1, N_SYMBOLS)[by_group]
    before = np.cumsum(sorted_follower, axis=0, dtype=np.int32) - sorted_follower
    sorted_key = key[by_group]
    group_start = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
    first_of_group = np.repeat(group_start, np.diff(np.r_[group_start, len(key)]))
    counts = np.empty_like(before)
    counts[by_group] = before - before[first_of_group]
    counts = counts.reshape(n_rows, length, N_SYMBOLS) + alpha
    return counts / counts.sum(axis=-1, keepdims=True)


def _model_scores(logits: torch.Tensor, ref: np.ndarray, allowed: np.ndarray) -> dict[str, np.ndarray]:
    logits = logits.detach().to("cpu", torch.float64)
    scores = position_scores(torch.softmax(logits[..., :N_SYMBOLS], dim=-1).numpy(),
                             torch.softmax(logits, dim=-1).numpy(), ref, allowed)
    return {f"regbench_{score}": value for score, value in scores.items()}


def _ngram_scores(inputs: np.ndarray, ref: np.ndarray, allowed: np.ndarray, alpha: float) -> dict[str, np.ndarray]:
    scores = {}
    for order in NGRAM_ORDERS:
        p_symbols = ngram_distributions(inputs, order, alpha)
        p_vocab = np.pad(p_symbols, ((0, 0), (0, 0), (0, VOCAB - N_SYMBOLS)))  # never predicts | or pad
        for score, value in position_scores(p_symbols, p_vocab, ref, allowed).items():
            scores[f"ngram{order}_{score}"] = value
    return scores


def _scores_in_batches(eval_set: EvalSet, batch_size: int,
                       score_fn: Callable[[np.ndarray, np.ndarray, np.ndarray], dict[str, np.ndarray]]
                       ) -> dict[str, np.ndarray]:
    """Per-position scores ``[N, T]``, computing ``score_fn(inputs, ref, allowed)`` batch by batch."""
    batches = [score_fn(eval_set.inputs[rows], eval_set.ref[rows].astype(np.float64), eval_set.valid_next[rows])
               for rows in (slice(i, i + batch_size) for i in range(0, len(eval_set.inputs), batch_size))]
    return {name: np.concatenate([batch[name] for batch in batches]) for name in batches[0]}


@lru_cache(maxsize=4)
def _reference_scores(cfg: RegBenchConfig, n_instances: int, alpha: float) -> dict[str, np.ndarray]:
    """N-gram per-position scores: independent of the model, so computed once per process."""
    scores = _scores_in_batches(heldout_set(cfg, n_instances), _NGRAM_BATCH,
                                lambda inputs, ref, allowed: _ngram_scores(inputs, ref, allowed, alpha))
    for value in scores.values():
        value.setflags(write=False)
    return scores


def _summaries(scores: dict[str, np.ndarray], eval_set: EvalSet) -> JobResult:
    """Pool per-position scores into metrics, curves over context size, and per-instance items."""
    valid = eval_set.valid
    weight = valid.sum(axis=1)
    metrics = {name: float(value[valid].mean()) for name, value in scores.items()}

    n_context = eval_set.n_context_strings[valid]
    n_positions = np.bincount(n_context)
    seen = np.flatnonzero(n_positions)
    curve = {"n_context_strings": seen.tolist(), "n_positions": n_positions[seen].tolist()}
    for name, value in scores.items():
        if name.endswith("_tvd"):
            curve[name] = (np.bincount(n_context, weights=value[valid])[seen] / n_positions[seen]).tolist()

    per_item = [np.where(valid, scores[name], 0).sum(axis=1) / np.maximum(weight, 1) for name in ITEM_METRICS]
    items = pd.DataFrame({"item_id": np.tile(np.arange(len(weight)), len(ITEM_METRICS)),
                          "metric": np.repeat(ITEM_METRICS, len(weight)),
                          "score": np.concatenate(per_item),
                          "weight": np.tile(weight, len(ITEM_METRICS))})
    return JobResult(metrics=metrics, curves={"tvd_by_context": curve}, items=items)


def evaluate(data_cfg: DataSpec, settings: RegBenchSettings,
             logits_fn: Callable[[torch.Tensor], torch.Tensor]) -> JobResult:
    """Score ``logits_fn`` on the held-out set: it maps CPU LongTensor inputs ``[B, T]``
    to logits ``[B, T, 20]`` (any device/dtype) and is called under ``torch.no_grad()``."""
    cfg = RegBenchConfig.parse(data_cfg)
    n_instances, batch_size = settings.instances, settings.batch_size
    eval_set = heldout_set(cfg, n_instances)
    with torch.no_grad():
        scores = _scores_in_batches(eval_set, batch_size, lambda inputs, ref, allowed: _model_scores(
            logits_fn(torch.from_numpy(inputs.copy())), ref, allowed))
    scores |= _reference_scores(cfg, n_instances, settings.ngram_alpha)
    return _summaries(scores, eval_set)


@evaluation("regbench", title="RegBench: in-context language learning", metrics=METRICS, curves=CURVES, data=("regbench",), settings=RegBenchSettings)
def regbench(cfg: JobConfig, run_dir: Path, progress: Progress) -> JobResult:
    """The registered job: the run's final checkpoint on the held-out automata."""
    model = cfg.backend.load_model(cfg, run_dir)
    device = next(model.parameters()).device
    return evaluate(cfg.data, cfg.eval.regbench, lambda inputs: model(inputs.to(device)))
