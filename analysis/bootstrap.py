"""Item-level resampling: the hierarchical seed x item bootstrap and the item noise of one run
(docs/statistics.md, sections c and a).

Input is the per-example table of `analysis.load_items` (family, size, seed, metric, item_id, score,
weight, optional cluster_id). An item's score is its mean over `weight` positions (RegBench: the valid
next-token positions of one instance; GSM8K: weight 1). Item means are pooled with those weights, as the
run-level metric pools positions, so with every item drawn once the statistics reproduce the run
metrics exactly. To give every item the same say instead, set weight to 1. A weight belongs to the item,
so it must be the same in every run. With cluster_id, whole clusters (questions sharing a passage or
template) are the resampling units.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

ITEM_TABLE_COLUMNS = ["family", "size", "seed", "metric", "item_id", "score", "weight"]
HB_N_BOOT = 2_000  # interactive; the final report uses 10,000
EXACT_DRAWS = 100_000  # exact=True enumerates the draws while there are at most this many
CHUNK_CELLS = 1 << 22  # resamples per chunk x units (or seeds): bounds memory at a few x 32 MB


def stable_rng(*key: object) -> np.random.Generator:
    """A generator seeded from a hash of `key` (analysis seed, cell, purpose) that, unlike Python's
    hash(), is the same in every process, so reports are reproducible byte for byte."""
    digest = hashlib.sha256("\x1f".join(map(str, key)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def _check_columns(items: pd.DataFrame) -> None:
    missing = [c for c in ITEM_TABLE_COLUMNS if c not in items.columns]
    if missing:
        raise ValueError(f"the item table lacks columns {missing} (see analysis.load_items)")


def _clustered(items: pd.DataFrame) -> bool:
    """Whether the rows resample whole clusters: they carry a cluster_id (then every item must)."""
    if "cluster_id" not in items.columns or items["cluster_id"].isna().all():
        return False
    if items["cluster_id"].isna().any():
        raise ValueError("cluster_id is missing for some items: give every item a cluster, or none")
    if (items.groupby("item_id")["cluster_id"].nunique() > 1).any():
        raise ValueError("an item belongs to several clusters")
    return True


def _units(items: pd.DataFrame) -> pd.Series:
    """The resampling unit of each row: its cluster when the rows have cluster ids, else its item."""
    return items["cluster_id"] if _clustered(items) else items["item_id"]


def _matrix(codes_row: np.ndarray, codes_col: np.ndarray, values: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    out = np.full(shape, np.nan)
    out[codes_row, codes_col] = values
    return out


def _unit_sums(items: pd.DataFrame, runs: list[tuple[str, object]]) -> tuple[np.ndarray, np.ndarray, int]:
    """sum(weight * score) per (run, unit) for `runs` (family, seed) in that order, sum(weight) per unit
    and the number of items used: those that every one of the runs scored."""
    run_index = pd.MultiIndex.from_tuples(runs, names=["family", "seed"])
    rows = run_index.get_indexer(pd.MultiIndex.from_frame(items[["family", "seed"]]))
    items, rows = items[rows >= 0], rows[rows >= 0]
    item_codes, item_ids = pd.factorize(items["item_id"], sort=True)
    shape = (len(runs), len(item_ids))
    score = _matrix(rows, item_codes, items["score"].to_numpy(float), shape)
    weight = _matrix(rows, item_codes, items["weight"].to_numpy(float), shape)
    scored = np.isfinite(score).all(0) & np.isfinite(weight).all(0)
    if not scored.any():
        return np.zeros((len(runs), 0)), np.zeros(0), 0
    score, weight = score[:, scored], weight[:, scored]
    if (weight != weight[:1]).any():
        raise ValueError("an item's weight differs across runs; a weight belongs to the item (its positions)")
    unit_of_item = pd.Series(_units(items).to_numpy(), index=item_codes).groupby(level=0).first()
    unit_codes = pd.factorize(unit_of_item[np.flatnonzero(scored)], sort=True)[0]
    order = np.argsort(unit_codes, kind="stable")
    starts = np.flatnonzero(np.diff(unit_codes[order], prepend=-1))
    yw = np.add.reduceat((weight * score)[:, order], starts, axis=1)
    return yw, np.add.reduceat(weight[0, order], starts), int(scored.sum())


def _delta(terms: list[np.ndarray], w: np.ndarray, seed_counts: list[np.ndarray] | None = None,
           unit_counts: np.ndarray | None = None) -> np.ndarray:
    """delta per draw: sum over terms of (mean over drawn seeds of the term's rows) . unit counts,
    divided by weight . unit counts. None keeps a factor as observed (every seed, or unit, once).

    Weights are shared by all runs, so the pooled item mean of every drawn seed has the same
    denominator and the seeds can be averaged first: one (draws x seeds) @ (seeds x units) product.
    """
    if unit_counts is None:  # items as observed: collapse them first, so a seeds-only draw costs O(seeds)
        terms, w, unit_counts = [m.sum(1, keepdims=True) for m in terms], w.sum(keepdims=True), np.ones((1, 1))
    if seed_counts is None:
        profile = sum(m.mean(0) for m in terms)
    else:
        profile = sum(counts @ m / m.shape[0] for counts, m in zip(seed_counts, terms))
    return (profile * unit_counts).sum(-1) / (unit_counts @ w)


def _all_counts(k: int) -> np.ndarray:
    """The k^k equally likely ordered draws of k units from k, as (k^k, k) counts."""
    draws = np.indices((k,) * k).reshape(k, -1).T
    return (draws[:, :, None] == np.arange(k)).sum(1)


def _counts(rng: np.random.Generator, k: int, size: int) -> np.ndarray:
    """`size` multinomial(k, uniform) draws as (size, k) counts: k units drawn with replacement from k,
    counted with one bincount (several times faster than Generator.multinomial)."""
    draws = rng.integers(0, k, (size, k), dtype=np.int32) + k * np.arange(size)[:, None]
    return np.bincount(draws.ravel(), minlength=size * k).reshape(size, k).astype(float)


def _draws(sizes: list[int], n_boot: int, rng: np.random.Generator, exact: bool) -> Iterator[list[np.ndarray]]:
    """Chunks of draws with replacement, one (draws, k) count matrix per factor of size k: n_boot
    multinomial draws, or every combination of the factors' ordered draws when exact."""
    chunk = max(1, CHUNK_CELLS // max(sizes))
    if exact:
        grids = [_all_counts(k) for k in sizes]
        combos = np.indices([len(g) for g in grids]).reshape(len(grids), -1)
        for start in range(0, combos.shape[1], chunk):
            yield [g[c[start:start + chunk]].astype(float) for g, c in zip(grids, combos)]
        return
    for start in range(0, n_boot, chunk):
        yield [_counts(rng, k, min(chunk, n_boot - start)) for k in sizes]


def _hb_nan(n_items: int = 0, n_units: int = 0) -> dict:
    return {"hb_n_items": n_items, "hb_n_units": n_units, "hb_n_boot": 0,
            **dict.fromkeys(["hb_diff_mean", "hb_boot_mean", "hb_low", "hb_high", "hb_p", "hb_p_ge_delta",
                             "hb_se", "hb_se_seeds", "hb_se_items"], math.nan)}


def studentised_p(delta: float, seed_values: list[np.ndarray], item_se: float) -> float:
    """One-sided p of "improvement <= 0" for the gap `delta`: the studentised gap T = delta / se with
    se^2 = sum over `seed_values` (the per-seed gaps when paired; each family's per-seed scores when
    unpaired) of var(ddof=1) / n, plus item_se^2 (the item bootstrap's spread), referred to Student's t
    with the seeds' degrees of freedom, min(n) - 1.

    Not the share of bootstrap draws with delta <= 0, nor the tail of the bootstrap-t distribution:
    with 3 seeds, resampling them gives 10 distinct draws, and when all 3 seeds happen to favour the
    candidate (one null cell in 8) no draw is <= 0; under seed-dominated noise that share was below
    0.05 in about 15% of null cells, the bootstrap-t tail in about 6.8%. With the seeds' df, T is at
    most the one-sided paired t on the per-seed gaps, exact for normal seeds, and the item term adds
    the spread of the shared items that the seed t leaves out (statistics.md (c)). NaN below 2 seeds
    (per family, unpaired); with no spread at all, 0 for a positive gap and 1 otherwise."""
    sizes = [len(v) for v in seed_values]
    if min(sizes) < 2:
        return math.nan
    se = math.sqrt(sum(float(np.var(v, ddof=1)) / len(v) for v in seed_values) + item_se ** 2)
    if se == 0:
        return 0.0 if delta > 0 else 1.0
    return float(stats.t.sf(delta / se, min(sizes) - 1))


def hierarchical(items: pd.DataFrame, candidate: str, baseline: str, sign: float, pairing: str,
                 rng: np.random.Generator, n_boot: int = HB_N_BOOT, level: float = 0.95, delta_min: float = 0.0,
                 exact: bool = False) -> dict:
    """`multibootstrap` on rows already narrowed to one comparison, with the sign and generator given
    (compare calls this with a generator keyed by its cell). NaN outputs when the families share no
    item or (paired) no seed."""
    if pairing not in ("paired", "unpaired"):
        raise ValueError(f"pairing must be 'paired' or 'unpaired', got {pairing!r}")
    items = items[items["family"].isin([candidate, baseline]) & np.isfinite(items["score"].to_numpy(float))]
    duplicated = items.duplicated(["family", "seed", "item_id"])
    if duplicated.any():
        first = items[duplicated].iloc[0]
        raise ValueError(f"family={first['family']} seed={first['seed']} scores item {first['item_id']!r} twice:"
                         " the runs differ in a config key; filter the table to one comparison first")
    seeds = {f: sorted(items.loc[items["family"] == f, "seed"].unique()) for f in (candidate, baseline)}
    if pairing == "paired":
        seeds[candidate] = seeds[baseline] = sorted(set(seeds[candidate]) & set(seeds[baseline]))
    runs = [(f, s) for f in (candidate, baseline) for s in seeds[f]]
    yw, w, n_items = _unit_sums(items, runs)
    if not (seeds[candidate] and seeds[baseline] and n_items):
        return _hb_nan(n_items, len(w))
    n_c = len(seeds[candidate])
    cand, base = sign * yw[:n_c], sign * yw[n_c:]
    terms = [cand - base] if pairing == "paired" else [cand, -base]
    sizes = [*(m.shape[0] for m in terms), len(w)]
    if exact:
        n_draws = math.prod(k**k for k in sizes)
        if n_draws > EXACT_DRAWS:
            raise ValueError(f"exact=True would enumerate {n_draws} draws (more than {EXACT_DRAWS})")
    crossed, seeds_only, items_only = [], [], []
    for *seed_counts, unit_counts in _draws(sizes, n_boot, rng, exact):
        crossed.append(_delta(terms, w, seed_counts, unit_counts))
        seeds_only.append(_delta(terms, w, seed_counts=seed_counts))
        items_only.append(_delta(terms, w, unit_counts=unit_counts))
    deltas = np.concatenate(crossed)
    low, high = np.quantile(deltas, [(1 - level) / 2, (1 + level) / 2])
    point, se_items = float(_delta(terms, w)[0]), float(np.concatenate(items_only).std())
    return {
        "hb_n_items": n_items, "hb_n_units": len(w), "hb_n_boot": len(deltas),
        "hb_diff_mean": point, "hb_boot_mean": float(deltas.mean()),
        "hb_low": float(low), "hb_high": float(high),
        "hb_p": studentised_p(point, [m.sum(1) / w.sum() for m in terms], se_items),
        "hb_p_ge_delta": float(np.mean(deltas >= delta_min)),
        "hb_se": float(deltas.std()), "hb_se_seeds": float(np.concatenate(seeds_only).std()),
        "hb_se_items": se_items,
    }


def _only(rows: pd.DataFrame, column: str) -> Any:
    values = rows[column].unique()
    if len(values) != 1:
        raise ValueError(f"the rows hold {len(values)} values of {column} ({list(values)[:5]}): "
                         f"filter the table to one comparison first")
    return values[0]


def multibootstrap(items: pd.DataFrame, candidate: str, baseline: str = "dense", *, metric: str | None = None,
                   higher_is_better: bool | None = None, pairing: str = "paired", n_boot: int = HB_N_BOOT,
                   level: float = 0.95, delta_min: float = 0.0, seed: int = 0, exact: bool = False) -> dict:
    """Hierarchical seed x item bootstrap of candidate - baseline (MultiBERTs' Multi-Bootstrap): how much
    the gap would move with other seeds *and* other evaluation items.

    `items` holds one comparison (one size, one setting of the config keys); `metric` picks one metric
    from a table holding several. delta = sign * (candidate - baseline) > 0 means better, the sign from
    `higher_is_better` (or the table's higher_is_better column). Each draw takes seeds with replacement
    (paired: one draw of the matched seeds for both families; unpaired: an independent draw per family
    from all its seeds) and items (or whole clusters) with replacement, the same item draw for every
    seed and both families; a family's score is the mean over its drawn seeds of each seed's pooled
    (weight-weighted) mean over the drawn items. exact=True enumerates every draw (at most EXACT_DRAWS
    of them) instead of n_boot random ones.

    Returns hb_n_items (items every run scored), hb_n_units (clusters, or items), hb_n_boot (draws),
    hb_diff_mean (the point estimate, on all seeds and items), hb_boot_mean, hb_low / hb_high (percentile
    interval at `level`), hb_p (the one-sided p of "improvement <= 0", `studentised_p`: the gap over
    the seed and item standard errors together, against Student's t with the seeds' df; NaN below 2
    seeds), hb_p_ge_delta (share of draws with delta >= delta_min), and the standard deviations of delta
    over the crossed draws (hb_se), over seed draws with the items fixed (hb_se_seeds) and over item
    draws with the seeds fixed (hb_se_items): whether more seeds or more eval items would narrow the
    interval. The one-factor bootstraps reuse the crossed draws. Deterministic for a given `seed`.
    """
    _check_columns(items)
    rows = items[items["family"].isin([candidate, baseline])]
    if metric is not None:
        rows = rows[rows["metric"] == metric]
    metric, size = _only(rows, "metric"), _only(rows, "size")
    if higher_is_better is None:
        if "higher_is_better" not in rows.columns:
            raise ValueError(f"pass higher_is_better for {metric}: the item table does not say")
        higher_is_better = bool(_only(rows, "higher_is_better"))
    rng = stable_rng(seed, candidate, baseline, size, metric, "multibootstrap")
    return hierarchical(rows, candidate, baseline, 1.0 if higher_is_better else -1.0, pairing, rng,
                        n_boot, level, delta_min, exact)


def _run_noise(run: pd.DataFrame, binary: bool) -> dict:
    y, w = run["score"].to_numpy(float), run["weight"].to_numpy(float)
    mean = np.sum(w * y) / np.sum(w)
    if binary:
        return {"n_items": len(y), "item_se": math.sqrt(mean * (1 - mean) / len(y))}
    residuals = pd.Series(w * (y - mean)).groupby(_units(run).to_numpy()).sum().to_numpy()
    g = len(residuals)
    se = math.sqrt(g / (g - 1) * np.sum(residuals**2)) / np.sum(w) if g > 1 else math.nan
    return {"n_items": len(y), "item_se": se}


def item_noise(items: pd.DataFrame, by: list[str] | None = None) -> pd.DataFrame:
    """Item noise of each run: n_items and item_se, the standard error of its metric over evaluation
    items (the spread a re-drawn eval set of the same size would give, seeds aside).

    Metrics whose item scores are all 0 or 1 (exact match) are proportions: sqrt(p (1 - p) / N), p the
    run's metric, as in (a). Any other metric, or one with cluster_id, gets the linearised SE of the
    pooled (weighted) mean, cluster-robust: sqrt(G / (G - 1) * sum_g (sum_{i in g} w_i (y_i - mean))^2)
    / sum w, which is std / sqrt(N) for unit weights without clusters. Per-instance fractions such as
    RegBench accuracy are in [0, 1] but pool many positions, so the binomial formula over instances
    would overstate their noise. One row per (family, size, `by`, metric, seed).
    """
    _check_columns(items)
    keys = ["family", "size", *(by or []), "metric", "seed"]
    items = items[np.isfinite(items["score"].to_numpy(float))]
    clustered = _clustered(items)
    binary = items.groupby("metric")["score"].agg(lambda s: s.isin([0, 1]).all() and not clustered)
    rows = [{**dict(zip(keys, values)), **_run_noise(run, bool(binary[run["metric"].iloc[0]]))}
            for values, run in items.groupby(keys, sort=True, dropna=False)]
    return pd.DataFrame(rows, columns=[*keys, "n_items", "item_se"])
