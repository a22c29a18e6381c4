"""Seed-level statistics for multi-seed comparisons (docs/statistics.md, sections a, b, d, e), with the
item-level columns of `analysis.bootstrap` (c) when per-example outputs are given.

The unit of replication is the seed. Every function takes the long table of `analysis.load`
(family, size, seed, metric, value, higher_is_better, plus the config keys that vary across the runs)
and returns a tidy table. A cell is (family, size, the values of `cell_keys`, metric): runs that differ
in a swept hyper-parameter such as train.lr are different experiments, never averaged together.
Resampling draws from `stable_rng`, so the same store always gives the same numbers.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager

import numpy as np
import pandas as pd
from scipy import stats
from scipy import integrate, optimize, special
from statsmodels.stats.multitest import multipletests

from analysis.bootstrap import HB_N_BOOT, hierarchical, item_noise, stable_rng
from analysis.load import KEY_COLUMNS, SEED_COLUMNS, VALUE_COLUMNS

CELL_COLUMNS = ["family", "size", "metric", "higher_is_better", "n_seeds", "seeds", "mean", "std", "sem", "ci_level",
                "ci_low", "ci_high", "boot_ci_low", "boot_ci_high", "boot_method", "n_boot",
                "boot_reliable", "boot_approximate", "single_seed", "skewness", "skewed", "n_items", "item_se", "iqm"]
HB_COLUMNS = ["hb_low", "hb_high", "hb_p", "hb_se_seeds", "hb_se_items"]  # of `hierarchical`, in compare
COMPARISON_COLUMNS = [
    "family", "baseline", "size", "metric", "higher_is_better", "pairing", "n_pairs", "n_candidate", "n_baseline",
    "seeds_dropped", "single_seed", "diff_mean", "raw_diff", "diff_std", "ci_level", "ci_low", "ci_high",
    "tost_low", "tost_high", "p_value", "correction", "p_adj", "p_holm", "welch_p", "welch_df",
    "welch_low", "welch_high", "signflip_p", "p_min_attainable", "prob_improvement", "mannwhitney_p",
    "seed_wins", "wins_low", "wins_high", "dz", *HB_COLUMNS, "sigma", "sigma_df", "sigma_pooled", "delta_min",
    "plan_alpha", "seeds_needed", "seeds_needed_conservative", "seeds_needed_observed", "seeds_more",
    "seeds_unresolvable", "hb_p_sided", "diff_skewed", "significant", "inside_margin", "verdict"]
REFERENCE_PREFIX = "ngram"
# The confirmatory metrics as callers may name them: see `confirmatory_metrics`.
PrimaryMetrics = str | Sequence[str] | AbstractSet[str] | Mapping[str, str | Sequence[str]]
N_BOOT = 9_999
BOOT_RELIABLE_N = 10  # below this BCa over seeds under-covers (0.74 at n=3, 0.92 at n=10)
BOOT_NOMINAL_N = 20  # below this BCa over seeds is flagged approximate (0.92 at n=10, 0.94 at n=20)
# Above this many seeds a cell is not resampled. It has no bootstrap interval: that exists to check
# the t-interval on few, perhaps skewed, seeds, and with thousands the t-interval holds by the
# central limit theorem, while BCa's cost grows with seeds squared (its jackknife) and its memory
# with resamples x seeds. Its sign-flip p is the normal approximation of the sign-flip
# distribution (mean 0, variance sum(delta^2) / n^2), which the resampled p only estimates with
# noise at that size, at resamples x seeds the cost (minutes for 50,000 seeds).
BOOT_MAX_N = 2_000
PERMUTATION_BATCH = 2**24  # values of sign-flip resamples held at once (128 MB), for large cells
SKEW_MIN_N = 5  # below this sample skewness cannot be told apart from normal noise: never flagged
SKEW_STRONG = 1.0  # |skewness| above 1 is "highly skewed" (Bulmer's rule of thumb)
HB_P_SIDED = "one-sided"  # hb_p is the p of "improvement <= 0" (analysis.bootstrap.studentised_p)
IQM_MIN_N = 4  # with 3 seeds the 25% trimmed mean is the mean
SEEDS_MAX = 50  # seeds_needed above this is reported as SEEDS_MAX + 1: "> 50"
EXACT_PERMUTATIONS = 100_000  # enumerate sign flips exactly while 2^n stays below this
POOL_BELOW_DF = 2  # a cell with fewer than 3 pairs borrows its seed noise from the other sizes
# Config keys that never split cells: family.* only exists for its own family (family.growth.alpha is
# NaN for dense), and the rest say where and how a run ran, which cannot change its results.
NON_CELL_PREFIXES = ("family.", "store.", "cluster.", "resources.", "eval.resources.", "tracker.", "adaptive.")
NON_CELL_KEYS = ("train.max_retries", "train.checkpoint_every", "train.snapshots")

# Degenerate inputs (identical values, two seeds) make scipy warn and return NaN or a zero-width
# interval; those outcomes are the documented results, so the warnings are not shown.
_EXPECTED_WARNINGS = (RuntimeWarning, stats.DegenerateDataWarning)

# The verdicts of `compare` (the sequential rule adds continue, futile and inconclusive at S_max).
BETTER, WORSE, INCONCLUSIVE = "better", "worse", "inconclusive"
EQUIVALENT = "equivalent"
NEGLIGIBLE = "equivalent (negligible difference)"
VERDICTS = {
    BETTER: "significant (adjusted p < alpha, CI above 0) and the 1 - 2 alpha CI not inside +-delta_min",
    WORSE: "significant (adjusted p < alpha, CI below 0) and the 1 - 2 alpha CI not inside +-delta_min",
    NEGLIGIBLE: "significant, but the 1 - 2 alpha CI lies inside +-delta_min: a real difference too small to matter",
    EQUIVALENT: "not significant, and the 1 - 2 alpha CI lies inside +-delta_min",
    INCONCLUSIVE: "none of the above",
}
EQUIVALENT_VERDICTS = (EQUIVALENT, NEGLIGIBLE)  # the 1 - 2 alpha CI lies inside the margin
DECIDED = (BETTER, WORSE, *EQUIVALENT_VERDICTS)  # the verdicts that settle a comparison


def is_reference(metric: str) -> bool:
    """ngram* metrics are in-context n-gram estimators, identical in every run: not model results."""
    return metric.startswith(REFERENCE_PREFIX)


@contextmanager
def _quiet():
    with warnings.catch_warnings():
        for category in _EXPECTED_WARNINGS:
            warnings.simplefilter("ignore", category)
        yield


def cell_keys(df: pd.DataFrame) -> list[str]:
    """The config columns of `df` that split cells, in table order: every column beyond the standard
    ones of `analysis.load` that varies within some (family, size).

    A key constant within each (family, size) only restates the family or the size (model.n_layers of
    looped, a size's own steps), so it must not stop a family from pairing with the baseline. Keys in
    NON_CELL_PREFIXES and NON_CELL_KEYS are left out as well.
    """
    standard = {*KEY_COLUMNS, *SEED_COLUMNS, *VALUE_COLUMNS}
    extra = [c for c in df.columns
             if c not in standard and not c.startswith(NON_CELL_PREFIXES) and c not in NON_CELL_KEYS]
    if not extra or df.empty:
        return []
    spread = df.groupby(["family", "size"], dropna=False)[extra].nunique(dropna=False).max()
    return [c for c in extra if spread[c] > 1]


def _keys(df: pd.DataFrame, by: Sequence[str] | None) -> list[str]:
    """`by`, or the detected `cell_keys` when it is None."""
    keys = cell_keys(df) if by is None else list(by)
    missing = [k for k in keys if k not in df.columns]
    if missing:
        raise ValueError(f"by names columns the table does not have: {missing}")
    return keys


def _after_size(columns: list[str], keys: list[str]) -> list[str]:
    """A table's columns with the cell keys right after `size`."""
    at = columns.index("size") + 1
    return [*columns[:at], *keys, *columns[at:]]


def _seed_values(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Finite values with one row per cell and seed; a duplicate means the runs differ in a config key
    that does not split cells, and mixing them would silently average different experiments."""
    values = df[np.isfinite(df["value"])]
    cell_seed = ["family", "size", *keys, "metric", "seed"]
    duplicated = values.duplicated(cell_seed, keep=False)
    if duplicated.any():
        _, same = next(iter(values[duplicated].groupby(cell_seed, dropna=False, sort=False)))
        example = same.iloc[0]
        differing = [c for c in same.columns if c not in ("run_id", "value") and same[c].nunique(dropna=False) > 1]
        raise ValueError(
            f"several runs for family={example['family']} size={example['size']} seed={example['seed']}"
            f" metric={example['metric']}{''.join(f' {k}={example[k]}' for k in keys)}: the runs differ in"
            f" another config key ({', '.join(differing) or 'not among the columns'}); filter the table first"
            " or name the key in by=")
    return values


def _directions(df: pd.DataFrame) -> dict[str, bool]:
    """metric -> higher_is_better, from the runs that declare it; runs disagreeing is a data error."""
    declared = df.dropna(subset=["higher_is_better"]).groupby("metric")["higher_is_better"].unique()
    conflicting = [metric for metric, values in declared.items() if len(values) > 1]
    if conflicting:
        raise ValueError(f"runs disagree on higher_is_better for {conflicting}")
    return {metric: bool(values[0]) for metric, values in declared.items()}


def t_interval(x: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """mean +- t(1 - (1 - level)/2, n - 1) * sem: the headline interval, which keeps its coverage
    with 3 seeds where bootstraps do not. NaN for fewer than 2 values."""
    if len(x) < 2:
        return math.nan, math.nan
    half = stats.t.ppf((1 + level) / 2, len(x) - 1) * stats.sem(x)  # zero when all seeds agree
    return float(np.mean(x) - half), float(np.mean(x) + half)


def bootstrap_ci(x: np.ndarray, rng: np.random.Generator, level: float = 0.95,
                 n_resamples: int = N_BOOT, method: str = "BCa") -> tuple[float, float]:
    """Bootstrap interval of the mean over seeds (secondary; trust it from BOOT_RELIABLE_N seeds)."""
    if len(x) < 2:
        return math.nan, math.nan
    with _quiet():
        ci = stats.bootstrap((x,), np.mean, n_resamples=n_resamples, confidence_level=level,
                             method=method, rng=rng).confidence_interval
    return float(ci.low), float(ci.high)


def skewness(x: np.ndarray) -> float:
    """Bias-adjusted sample skewness G1 (scipy.stats.skew(bias=False)); NaN below 3 values or when
    all values agree."""
    x = np.asarray(x, float)
    if len(x) < 3 or np.ptp(x) == 0:
        return math.nan
    return float(stats.skew(x, bias=False))


def skew_threshold(n: int) -> float:
    """|G1| above which `n` values count as strongly skewed: max(SKEW_STRONG, 2 * SE(G1)), where
    SE(G1) = sqrt(6 n (n - 1) / ((n - 2) (n + 1) (n + 3))) is its standard error under normality.
    Normal seeds pass this about 5% of the time (n = 5-20, less from 30); infinite below SKEW_MIN_N."""
    if n < SKEW_MIN_N:
        return math.inf
    return max(SKEW_STRONG, 2 * math.sqrt(6 * n * (n - 1) / ((n - 2) * (n + 1) * (n + 3))))


def is_skewed(x: np.ndarray) -> bool:
    """Whether the seed values are strongly skewed (see `skew_threshold`): then the t-interval's
    coverage promise does not hold (with strongly skewed seeds it drops to 0.82-0.92). Never True
    below SKEW_MIN_N values, where skew cannot be told from noise; at 5-10 seeds only blatant skew
    (one far outlier) is caught."""
    g = skewness(x)
    return bool(np.isfinite(g) and abs(g) > skew_threshold(len(x)))


def iqm(x: np.ndarray) -> float:
    """Interquartile mean (rliable's IQM, the 25% trimmed mean); NaN below IQM_MIN_N values."""
    return float(stats.trim_mean(x, 0.25)) if len(x) >= IQM_MIN_N else math.nan


def _keyed_items(items: pd.DataFrame, df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """The item rows with the cell keys of their runs: the item table's own columns when it has them,
    else looked up in `df` by run_id (load_items carries no config keys)."""
    missing = [k for k in keys if k not in items.columns]
    if not missing:
        return items
    if "run_id" not in items.columns or "run_id" not in df.columns:
        raise ValueError(f"the item table lacks the cell keys {missing}, and run_id to look them up by")
    return items.merge(df[["run_id", *missing]].drop_duplicates("run_id"), on="run_id", how="inner")


def _select(table: pd.DataFrame, columns: list[str], values: Sequence) -> pd.DataFrame:
    """The rows of `table` whose `columns` equal `values`, NaN matching NaN as in groupby(dropna=False)."""
    mask = np.ones(len(table), bool)
    for column, value in zip(columns, values):
        mask &= table[column].isna().to_numpy() if pd.isna(value) else (table[column] == value).to_numpy()
    return table[mask]


def _cell_noise(items: pd.DataFrame | None, df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per cell, n_items (the fewest of any of its runs; runs normally share one eval set) and item_se,
    the root mean square over its runs of each run's `item_noise`: the item noise of one run."""
    cell_columns = ["family", "size", *keys, "metric"]
    if items is None:
        return pd.DataFrame(columns=[*cell_columns, "n_items", "item_se"])
    noise = item_noise(_keyed_items(items, df, keys), by=keys).assign(se2=lambda t: t["item_se"] ** 2)
    cells = noise.groupby(cell_columns, dropna=False).agg(n_items=("n_items", "min"), se2=("se2", "mean"))
    return cells.assign(item_se=np.sqrt(cells.pop("se2"))).reset_index()


def _join(seeds) -> str:
    return ",".join(str(s) for s in sorted(seeds))


def summarize(df: pd.DataFrame, level: float = 0.95, n_boot: int = N_BOOT, seed: int = 0,
              by: Sequence[str] | None = None, items: pd.DataFrame | None = None) -> pd.DataFrame:
    """The `cells` table: per cell (family, size, cell keys, metric), mean, std, sem, t-interval
    (headline), BCa bootstrap interval (secondary, flagged unreliable below 10 seeds and approximate,
    boot_approximate, below BOOT_NOMINAL_N = 20, where its coverage is still under nominal) and IQM
    (from 4 seeds). skewness is the bias-adjusted sample skewness of the seed values and skewed flags
    strongly skewed cells (`is_skewed`: from 5 seeds, |skewness| > max(1, 2 SE)), whose t-interval
    may cover less than its level. With `items` (the table of `analysis.load_items`), n_items and
    item_se say how much one run's metric would move on a re-drawn eval set (see `_cell_noise` and
    `item_noise`); without them, or for cells without items, they are NA.

    The cell keys are `by`, or `cell_keys(df)` when by is None (the default), and come right after
    `size`. `seeds` is the sorted seeds as comma-separated text. NaN values are left out.
    """
    keys = _keys(df, by)
    cell_columns = ["family", "size", *keys, "metric"]
    directions = _directions(df)
    rows = []
    for cell_values, cell in _seed_values(df, keys).groupby(cell_columns, sort=True, dropna=False):
        x = cell.sort_values("seed")["value"].to_numpy(float)
        n = len(x)
        ci = t_interval(x, level)
        boot = (bootstrap_ci(x, stable_rng(seed, *cell_values, "cell-bootstrap"), level, n_boot)
                if n <= BOOT_MAX_N else (math.nan, math.nan))
        metric = cell_values[-1]
        rows.append({
            **dict(zip(cell_columns, cell_values)),
            "higher_is_better": directions.get(metric), "n_seeds": n, "seeds": _join(cell["seed"]),
            "mean": float(np.mean(x)), "std": float(np.std(x, ddof=1)) if n > 1 else math.nan,
            "sem": float(stats.sem(x)) if n > 1 else math.nan, "ci_level": level,
            "ci_low": ci[0], "ci_high": ci[1], "boot_ci_low": boot[0], "boot_ci_high": boot[1],
            "boot_method": "BCa" if n <= BOOT_MAX_N else f"none (over {BOOT_MAX_N} seeds)",
            "n_boot": n_boot, "boot_reliable": n >= BOOT_RELIABLE_N,
            "boot_approximate": n < BOOT_NOMINAL_N, "single_seed": n == 1,
            "skewness": skewness(x), "skewed": is_skewed(x), "iqm": iqm(x),
        })
    columns = _after_size(CELL_COLUMNS, keys)
    cells = pd.DataFrame(rows, columns=[c for c in columns if c not in ("n_items", "item_se")])
    cells = cells.merge(_cell_noise(items, df, keys), on=cell_columns, how="left")[columns]
    return cells.astype({"higher_is_better": "boolean", "n_items": "Int64", "item_se": float})


def pooled_std(std: Sequence[float], n: Sequence[int]) -> tuple[float, int]:
    """sqrt(sum((n_i - 1) s_i^2) / sum(n_i - 1)) and its degrees of freedom, over groups with n_i >= 2:
    one estimate of seed noise from several cells when each has too few seeds."""
    stds, sizes = np.asarray(std, float), np.asarray(n, int)
    usable = (sizes >= 2) & np.isfinite(stds)
    df = int(np.sum(sizes[usable] - 1))
    if df == 0:
        return math.nan, 0
    return float(np.sqrt(np.sum((sizes[usable] - 1) * stds[usable] ** 2) / df)), df


def sigma_upper(sigma: float, df: int, level: float = 0.8) -> float:
    """One-sided `level` upper confidence bound of a standard deviation with `df` degrees of freedom.
    A sigma from 3 seeds is very uncertain; planning with this bound is the conservative reading."""
    return float(sigma * np.sqrt(df / stats.chi2.ppf(1 - level, df))) if df > 0 else math.nan


def _tail_by_integration(c: float, df: float, nc: float) -> float:
    """P(T > c) for T noncentral t (df, nc) from its definition T = (Z + nc) / sqrt(V / df), V ~ chi2(df):
    the integral over V of Phi(nc - c sqrt(V / df)). Slow, but finite wherever scipy's nct is not."""
    log_norm = -special.gammaln(df / 2) - df / 2 * math.log(2)

    def integrand(v):  # Phi(nc - c sqrt(v / df)) times the chi-square(df) density at v
        if v <= 0:
            return 0.0
        return special.ndtr(nc - c * math.sqrt(v / df)) * math.exp(log_norm + (df / 2 - 1) * math.log(v) - v / 2)
    value = integrate.quad(integrand, 0, np.inf, limit=200)[0]
    return min(1.0, max(0.0, value))


def t_power(effect, n, alpha: float = 0.05, paired: bool = True) -> np.ndarray | float:
    """Power of the two-sided t-test at level alpha for a standardised effect (paired: dz = delta /
    diff_std with n pairs, df n - 1, noncentrality dz sqrt(n); unpaired: Cohen's d with n seeds per
    family, df 2n - 2, noncentrality d sqrt(n / 2)), as statsmodels' TTestPower / TTestIndPower define it:
    P(T > c) + P(T < -c), T noncentral t, c = t(1 - alpha/2, df). Vectorised over effect and n.

    Both tails are upper tails of scipy's nct (P(T < -c | nc) = P(T > c | -nc)): statsmodels takes the
    lower one from nct.cdf, which with scipy 1.17 returns NaN for many noncentralities above about 6.7
    (dz 11.25 at 3 to 8 pairs), where the power is near 1; nct.sf does not. Any
    value still not finite is integrated from the definition (`_tail_by_integration`).
    """
    scalar = np.ndim(effect) == 0 and np.ndim(n) == 0
    effect, n = np.broadcast_arrays(np.abs(np.atleast_1d(np.asarray(effect, float))),
                                    np.atleast_1d(np.asarray(n, float)))
    df = n - 1 if paired else 2 * n - 2
    nc = effect * np.sqrt(n if paired else n / 2)
    c = stats.t.ppf(1 - alpha / 2, df)
    with _quiet():
        upper = np.array(stats.nct.sf(c, df, nc), float)
        lower = np.array(stats.nct.sf(c, df, -nc), float)
    for tail, sign in ((upper, 1.0), (lower, -1.0)):
        for i in zip(*np.nonzero(~np.isfinite(tail) & np.isfinite(nc) & (df > 0))):
            tail[i] = _tail_by_integration(c[i], df[i], sign * nc[i])
    power = np.clip(upper + lower, 0.0, 1.0)
    return float(power[0]) if scalar else power


def seeds_needed(sigma: float, delta: float, alpha: float = 0.05, power: float = 0.8,
                 paired: bool = True, max_seeds: int = SEEDS_MAX) -> int:
    """Smallest n >= 2 (pairs, or seeds per family when unpaired) whose two-sided t-test reaches
    `power` for a true gap `delta` with seed noise `sigma`; max_seeds + 1 means "more than max_seeds".

    Searched over integers, because solve_power returns fractional n and can fail to converge for
    large effects. Power comes from `t_power`, which is finite for every effect (statsmodels' power
    is NaN for large ones, which the search read as "not reached": dz 11.25 gave 9 seeds, not 3).
    For planning only: post-hoc power of an observed effect is not evidence.
    """
    _check_plan(sigma, alpha, power)
    if not np.isfinite(delta):
        raise ValueError(f"delta must be a finite number, got {delta}: the seeds needed are unknown")
    if delta == 0:
        return max_seeds + 1
    if sigma == 0:
        return 2
    n = np.arange(2, max_seeds + 1)
    reached = np.asarray(t_power(abs(delta) / sigma, n, alpha, paired) >= power)
    return int(n[np.argmax(reached)]) if reached.any() else max_seeds + 1


def _check_plan(sigma: float, alpha: float, power: float) -> None:
    """Planning inputs must be known: a NaN sigma, level or power raises instead of becoming a number
    (t_power of a NaN is NaN, which a search over seeds would read as "never reached")."""
    if not sigma >= 0:
        raise ValueError(f"sigma must be a non-negative number, got {sigma}: the seed noise is unknown")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not alpha < power < 1:
        raise ValueError(f"power must be in (alpha, 1), got {power}")


def mde(sigma: float, n: int, alpha: float = 0.05, power: float = 0.8, paired: bool = True) -> float:
    """Minimum detectable effect: the smallest true gap |delta| whose two-sided t-test at level alpha
    reaches `power` with n seeds (pairs, or seeds per family when unpaired) and seed noise `sigma`
    (paired: the std of the paired differences; unpaired: the pooled std), i.e. sigma times the
    standardised effect at which `t_power` reaches `power` (power grows with the effect; found by
    Brent's method on t_power). The inverse of `seeds_needed` in the effect: seeds_needed(sigma,
    delta) is n for any delta a little above mde(sigma, n) (when n - 1 seeds do not reach it).
    Raises ValueError for a NaN sigma (the noise unknown: so is the effect) and for fewer than 2 seeds
    (no test). For planning only, as seeds_needed."""
    _check_plan(sigma, alpha, power)
    if not n >= 2:
        raise ValueError(f"n must be at least 2 seeds, got {n}: one seed cannot be tested")
    if sigma == 0:
        return 0.0
    return float(sigma) * effect_for_power(int(n), alpha, power, paired)


def effect_for_power(n: int, alpha: float = 0.05, power: float = 0.8, paired: bool = True) -> float:
    """The standardised effect (dz paired, Cohen's d unpaired) at which the two-sided t-test at level
    alpha with n seeds reaches `power`: `mde` in units of the seed noise."""
    _check_plan(0.0, alpha, power)
    if not n >= 2:
        raise ValueError(f"n must be at least 2 seeds, got {n}: one seed cannot be tested")

    def short(effect: float) -> float:
        return float(t_power(effect, n, alpha, paired)) - power
    high = 1.0
    while short(high) < 0:  # t_power(0) = alpha < power, so the root lies above 0
        high *= 2
        if high > 1e9:
            raise ValueError(f"no effect reaches power {power} with {n} seeds at level {alpha}")
    return float(optimize.brentq(short, 0.0, high, xtol=1e-12, rtol=1e-12))


def adjust_pvalues(p: Sequence[float], method: str, alpha: float = 0.05) -> np.ndarray:
    """statsmodels' multipletests with the method always explicit (its default is Holm-Sidak);
    NaN p-values (untestable comparisons) stay NaN and do not count towards the family size."""
    values = np.asarray(p, float)
    adjusted = np.full_like(values, np.nan)
    testable = np.isfinite(values)
    if testable.any():
        adjusted[testable] = multipletests(values[testable], alpha=alpha, method=method)[1]
    return adjusted


def holm(p: Sequence[float], alpha: float = 0.05) -> np.ndarray:
    """Holm step-down adjusted p-values: family-wise error control for the confirmatory family."""
    return adjust_pvalues(p, "holm", alpha)


def p_min_signflip(n: int) -> float:
    """Smallest two-sided p an exact sign-flip test can reach with n pairs: 2 / 2^n (0.25 at n=3)."""
    return min(1.0, 2 / 2**n) if n > 0 else math.nan


def p_min_mannwhitney(n_x: int, n_y: int) -> float:
    """Smallest two-sided exact Mann-Whitney p for n_x vs n_y values: 2 / C(n_x + n_y, n_x)."""
    return min(1.0, 2 / math.comb(n_x + n_y, n_x)) if n_x and n_y else math.nan


def _signflip_p(delta: np.ndarray, rng: np.random.Generator) -> float:
    """The sign-flip test's p; a large cell's resamples are drawn in batches (the same draws, in
    the same order, so the same p), which bounds the memory. Above BOOT_MAX_N pairs, its normal
    approximation."""
    if len(delta) > BOOT_MAX_N:
        spread = math.sqrt(float(np.sum(delta ** 2)))
        return float(2 * stats.norm.sf(abs(float(np.sum(delta))) / spread)) if spread > 0 else 1.0
    exact = 2 ** len(delta) <= EXACT_PERMUTATIONS
    batch = PERMUTATION_BATCH // len(delta) if len(delta) * N_BOOT > PERMUTATION_BATCH else None
    result = stats.permutation_test((delta,), np.mean, permutation_type="samples", vectorized=True,
                                    n_resamples=np.inf if exact else N_BOOT, rng=rng, batch=batch)
    return float(result.pvalue)


def compare_seeds(candidate: pd.Series, baseline: pd.Series, pairing: str = "paired",
                  alpha: float = 0.05, rng: np.random.Generator | None = None) -> dict:
    """All seed-level statistics of one comparison; both series are indexed by seed and already
    signed so that larger is better.

    The main test follows `pairing` (paired t on the matched seeds, or Welch on all seeds); Welch,
    the sign-flip test, P(X > Y) and seed wins are always reported beside it. In unpaired mode
    diff_std is the pooled seed std of the two families and dz is Cohen's d.
    """
    if pairing not in ("paired", "unpaired"):
        raise ValueError(f"pairing must be 'paired' or 'unpaired', got {pairing!r}")
    rng = rng if rng is not None else stable_rng("compare_seeds")
    common = candidate.index.intersection(baseline.index).sort_values()
    delta = (candidate[common] - baseline[common]).to_numpy(float)
    x, y = candidate.to_numpy(float), baseline.to_numpy(float)
    n, n_x, n_y = len(delta), len(x), len(y)
    nan2 = (math.nan, math.nan)
    with _quiet():
        paired = stats.ttest_rel(candidate[common], baseline[common]) if n >= 2 else None
        welch = stats.ttest_ind(x, y, equal_var=False) if min(n_x, n_y) >= 2 else None
        main = paired if pairing == "paired" else welch
        ci = main.confidence_interval(1 - alpha) if main else nan2
        tost = main.confidence_interval(1 - 2 * alpha) if main else nan2
        welch_ci = welch.confidence_interval(1 - alpha) if welch else nan2
        u = stats.mannwhitneyu(x, y) if n_x and n_y else None
        signflip = _signflip_p(delta, rng) if n >= 2 else math.nan
    if pairing == "paired":
        diff_mean = float(delta.mean()) if n else math.nan
        diff_std = float(delta.std(ddof=1)) if n >= 2 else math.nan
        p_min = p_min_signflip(n)
    else:
        diff_mean = float(x.mean() - y.mean()) if n_x and n_y else math.nan
        diff_std = pooled_std([np.std(x, ddof=1) if n_x > 1 else math.nan,
                               np.std(y, ddof=1) if n_y > 1 else math.nan], [n_x, n_y])[0]
        p_min = p_min_mannwhitney(n_x, n_y)
    skewed = is_skewed(delta) if pairing == "paired" else is_skewed(x) or is_skewed(y)
    wins = int(np.sum(delta > 0))
    wins_ci = stats.binomtest(wins, n).proportion_ci(method="exact") if n else None
    return {
        "pairing": pairing, "n_pairs": n, "n_candidate": n_x, "n_baseline": n_y,
        "seeds_dropped": _join(candidate.index.symmetric_difference(baseline.index)) if pairing == "paired" else "",
        "single_seed": (n if pairing == "paired" else min(n_x, n_y)) < 2,
        "diff_mean": diff_mean, "diff_std": diff_std, "ci_level": 1 - alpha,
        "ci_low": float(ci[0]), "ci_high": float(ci[1]),
        "tost_low": float(tost[0]), "tost_high": float(tost[1]),
        "p_value": float(main.pvalue) if main else math.nan,
        "welch_p": float(welch.pvalue) if welch else math.nan, "welch_df": float(welch.df) if welch else math.nan,
        "welch_low": float(welch_ci[0]), "welch_high": float(welch_ci[1]),
        "signflip_p": signflip, "p_min_attainable": p_min,
        "prob_improvement": float(u.statistic) / (n_x * n_y) if u else math.nan,
        "mannwhitney_p": float(u.pvalue) if u else math.nan,
        "seed_wins": wins, "wins_low": wins_ci.low if wins_ci else math.nan,
        "wins_high": wins_ci.high if wins_ci else math.nan,
        "dz": diff_mean / diff_std if diff_std > 0 else math.nan,
        "diff_skewed": skewed,
    }


def _sigma(table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Seed noise for planning: the cell's own when it has 3+ pairs, else pooled over the sizes of the
    same (family, cell keys, metric). Adds sigma, sigma_df and sigma_pooled."""
    own_df = np.where(table["pairing"] == "paired", table["n_pairs"] - 1,
                      table["n_candidate"] + table["n_baseline"] - 2).clip(min=0)
    table = table.assign(sigma=table["diff_std"], sigma_df=own_df, sigma_pooled=own_df < POOL_BELOW_DF)
    for _, group in table.groupby(["family", *keys, "metric"], dropna=False):
        sigma, df = pooled_std(group["diff_std"], group["sigma_df"] + 1)
        borrow = group.index[group["sigma_pooled"]]
        table.loc[borrow, "sigma"] = sigma
        table.loc[borrow, "sigma_df"] = df
    return table


def _plan(row: pd.Series, delta: float, alpha: float, conservative: bool = False):
    """seeds_needed for one comparison row, or NA when its seed noise or the gap is unknown."""
    sigma = sigma_upper(row["sigma"], row["sigma_df"]) if conservative else row["sigma"]
    if not (np.isfinite(sigma) and np.isfinite(delta)):
        return pd.NA
    return seeds_needed(sigma, delta, alpha, paired=row["pairing"] == "paired")


def significant(p_adj, ci_low, ci_high, alpha: float) -> np.ndarray:
    """Adjusted p below alpha and the 1 - alpha interval excluding 0 (vectorised; NaN counts as no)."""
    p_adj, ci_low, ci_high = (np.asarray(v, float) for v in (p_adj, ci_low, ci_high))
    with np.errstate(invalid="ignore"):
        return (p_adj < alpha) & ((ci_low > 0) | (ci_high < 0))


def inside_margin(tost_low, tost_high, delta_min) -> np.ndarray:
    """The 1 - 2 alpha interval inside (-delta_min, delta_min): two one-sided tests at alpha (vectorised;
    a NaN margin or interval counts as no)."""
    tost_low, tost_high, delta_min = (np.asarray(v, float) for v in (tost_low, tost_high, delta_min))
    with np.errstate(invalid="ignore"):
        return (-delta_min < tost_low) & (tost_high < delta_min)


def verdict_rule(p_adj, ci_low, ci_high, tost_low, tost_high, delta_min, alpha: float) -> np.ndarray:
    """compare's verdict, vectorised over comparisons (see VERDICTS). Equivalence takes precedence:
    an interval inside +-delta_min is "equivalent", or NEGLIGIBLE ("equivalent (negligible
    difference)") when the difference is also significant; "better" / "worse" need a significant
    difference whose 1 - 2 alpha interval is not inside the margin; anything else is inconclusive."""
    sig = significant(p_adj, ci_low, ci_high, alpha)
    inside = inside_margin(tost_low, tost_high, delta_min)
    above = np.asarray(ci_low, float) > 0
    return np.select([inside & sig, inside, sig & above, sig],
                     [NEGLIGIBLE, EQUIVALENT, BETTER, WORSE], INCONCLUSIVE).astype(object)


def confirmatory_metrics(primary_metrics: PrimaryMetrics) -> tuple[str, ...]:
    """The confirmatory (Holm) metrics as a tuple without repeats: one metric name, a sequence or set of
    names, or a mapping data kind -> metric name or names (e.g. {"regbench": "regbench_tvd",
    "induction": ["induction_max"]}), all of whose metrics are confirmatory together."""
    if isinstance(primary_metrics, str):
        names = [primary_metrics]
    elif isinstance(primary_metrics, Mapping):
        names = []
        for metrics in primary_metrics.values():
            names += [metrics] if isinstance(metrics, str) else list(metrics)
    elif isinstance(primary_metrics, AbstractSet):
        names = sorted(primary_metrics)
    else:
        names = list(primary_metrics)
    bad = [m for m in names if not isinstance(m, str)]
    if bad:
        raise ValueError(f"confirmatory metrics must be metric names, got {bad}")
    return tuple(dict.fromkeys(names))


def compare(df: pd.DataFrame, baseline: str = "dense", pairing: str = "paired",
            primary_metrics: PrimaryMetrics = ("regbench_tvd",),
            alpha: float = 0.05,
            delta_min: float | Mapping[str, float] = 0.02, seed: int = 0,
            by: Sequence[str] | None = None, items: pd.DataFrame | None = None,
            n_boot: int = HB_N_BOOT) -> pd.DataFrame:
    """The `comparisons` table: every family against `baseline`, per size, cell keys and metric.

    The cell keys are `by`, or `cell_keys(df)` when by is None (the default), and come right after
    `size`: a family is paired with the baseline at the same values of them (lidas at lr 0.003
    against dense at lr 0.003), seed by seed.
    delta = sign * (candidate - baseline), so delta > 0 always means better than the baseline.
    p_adj is Holm over the confirmatory family (families x sizes x cell-key values x primary metrics,
    column correction = "holm", also in p_holm) and Benjamini-Hochberg over all other metrics ("fdr_bh",
    exploratory). `primary_metrics` (the confirmatory metrics) may be one name, a sequence or set of
    names, or a mapping data kind -> name(s) (`confirmatory_metrics`); all of them form one Holm family.
    significant: adjusted p < alpha and the CI excludes 0; inside_margin: the 1 - 2 alpha CI
    (tost_low..tost_high) lies inside +-delta_min. verdict (`verdict_rule`, VERDICTS): "equivalent
    (negligible difference)" when both, "equivalent" when only inside the margin, better / worse when
    significant and not inside the margin, else inconclusive.
    seeds_needed* are the seeds (pairs, or per family when unpaired) for 80% power at delta_min, at
    the upper 80% bound of sigma (conservative) and at the observed gap; SEEDS_MAX + 1 means
    "more than SEEDS_MAX" (seeds_unresolvable, and then seeds_more is NA). `delta_min` may map
    metric -> margin; metrics not in the mapping get no equivalence verdict and no delta_min planning.
    Reference (ngram*) metrics and metrics without a declared direction are not compared.
    With `items` (the table of `analysis.load_items`), hb_* are the hierarchical seed x item bootstrap
    of `analysis.multibootstrap` with n_boot draws: percentile interval at 1 - alpha, hb_p and the
    seed and item parts of its spread; NaN for metrics without items. hb_p is one-sided (the p of
    "improvement <= 0": the gap over its seed and item standard errors, against Student's t with the
    seeds' df, `analysis.bootstrap.studentised_p`), unlike the two-sided p_value beside it: hb_p_sided
    says so ("one-sided").
    The item table gets its cell keys from `df` by run_id when it lacks them.
    diff_skewed flags comparisons whose paired differences (unpaired: either family's seed values) are
    strongly skewed (`is_skewed`), where the t-interval may cover less than its level.
    """
    primary_metrics = confirmatory_metrics(primary_metrics)
    keys = _keys(df, by)
    setting_columns = ["size", *keys, "metric"]
    directions = _directions(df)
    values = _seed_values(df, keys)
    values = values[~values["metric"].map(is_reference).astype(bool) & values["metric"].isin(directions)]
    keyed_items = None if items is None else _keyed_items(items, df, keys)
    rows = []
    for setting, cell in values.groupby(setting_columns, sort=True, dropna=False):
        metric = setting[-1]
        sign = 1.0 if directions[metric] else -1.0
        by_family = {family: sign * g.set_index("seed")["value"] for family, g in cell.groupby("family")}
        if baseline not in by_family:
            continue
        cell_items = None if keyed_items is None else _select(keyed_items, setting_columns, setting)
        for family in sorted(set(by_family) - {baseline}):
            rng = stable_rng(seed, family, baseline, *setting, "signflip")
            hb = dict.fromkeys(HB_COLUMNS, math.nan)
            if cell_items is not None and not cell_items.empty:
                hb_rng = stable_rng(seed, family, baseline, *setting, "multibootstrap")
                hb = hierarchical(cell_items, family, baseline, sign, pairing, hb_rng, n_boot, 1 - alpha)
            rows.append({"family": family, "baseline": baseline, **dict(zip(setting_columns, setting)),
                         "higher_is_better": directions[metric],
                         **compare_seeds(by_family[family], by_family[baseline], pairing, alpha, rng),
                         **{c: hb[c] for c in HB_COLUMNS}})
    columns = _after_size(COMPARISON_COLUMNS, keys)
    if not rows:
        return pd.DataFrame(columns=columns)
    table = _sigma(pd.DataFrame(rows), keys)
    table["raw_diff"] = np.where(table["higher_is_better"].astype(bool), 1.0, -1.0) * table["diff_mean"]
    if isinstance(delta_min, Mapping):
        table["delta_min"] = table["metric"].map(delta_min).astype(float)
    else:
        table["delta_min"] = float(delta_min)
    table["correction"] = np.where(table["metric"].isin(primary_metrics), "holm", "fdr_bh")
    table["p_adj"] = math.nan
    for method, group in table.groupby("correction"):
        table.loc[group.index, "p_adj"] = adjust_pvalues(group["p_value"], method, alpha)
    table["p_holm"] = table["p_adj"].where(table["correction"] == "holm")
    # Confirmatory comparisons are planned at the level Holm applies at its first step, alpha / m over
    # the m testable ones, so the seeds give the power after the correction; exploratory ones at alpha.
    m = table.loc[table["correction"] == "holm", "p_value"].notna().sum()
    table["plan_alpha"] = np.where(table["correction"] == "holm", alpha / max(1, m), alpha)
    plans = {
        "seeds_needed": lambda r: _plan(r, r["delta_min"], r["plan_alpha"]),
        "seeds_needed_conservative": lambda r: _plan(r, r["delta_min"], r["plan_alpha"], conservative=True),
        "seeds_needed_observed": lambda r: _plan(r, abs(r["diff_mean"]), r["plan_alpha"]),
    }
    for column, plan in plans.items():
        table[column] = table.apply(plan, axis=1).astype("Int64")
    have = np.where(table["pairing"] == "paired", table["n_pairs"],
                    np.minimum(table["n_candidate"], table["n_baseline"]))
    table["seeds_unresolvable"] = (table["seeds_needed"] > SEEDS_MAX).fillna(False).astype(bool)
    table["seeds_more"] = (table["seeds_needed"] - have).clip(lower=0).mask(table["seeds_unresolvable"])
    table["hb_p_sided"] = HB_P_SIDED
    table["significant"] = significant(table["p_adj"], table["ci_low"], table["ci_high"], alpha)
    table["inside_margin"] = inside_margin(table["tost_low"], table["tost_high"], table["delta_min"])
    table["verdict"] = verdict_rule(table["p_adj"], table["ci_low"], table["ci_high"], table["tost_low"],
                                    table["tost_high"], table["delta_min"], alpha)
    return table.sort_values(["metric", "size", *keys, "family"], ignore_index=True)[columns]


# ---- where the seed spread comes from: init x data (docs/statistics.md, "Where the seed spread comes from")

SEED_SOURCE_COLUMNS = ["family", "size", "metric", "n_init", "n_data", "total_var", "ms_init", "ms_data",
                       "ms_residual", "var_init", "var_data", "var_residual", "share_init", "share_data",
                       "share_residual", "init_truncated", "data_truncated"]


def variance_components(values: Sequence[float], init: Sequence, data: Sequence) -> dict[str, float | int | bool]:
    """The between-run variance of one cell split into an initialisation part, a data-order part and
    a residual, by the two-way random-effects ANOVA without replication: one run per (init seed,
    data seed) of a complete a x b grid (a, b >= 2), y_ij = mu + I_i + D_j + e_ij.

    With row (init) means m_i., column (data) means m_.j and grand mean m..,
    MS_init = b sum_i (m_i. - m..)^2 / (a - 1), MS_data = a sum_j (m_.j - m..)^2 / (b - 1) and
    MS_res = sum_ij (y_ij - m_i. - m_.j + m..)^2 / ((a - 1)(b - 1)); their expectations are
    s_e^2 + b s_I^2, s_e^2 + a s_D^2 and s_e^2, so var_init = (MS_init - MS_res) / b,
    var_data = (MS_data - MS_res) / a and var_residual = MS_res (which holds the init x data
    interaction too: without replication it cannot be told apart from noise). A negative estimate
    is set to 0 and flagged (init_truncated, data_truncated). The shares are each part over their
    sum (NaN when all are 0); total_var is the plain variance of the values, for reference.

    Raises ValueError when the runs are not such a grid (a pair twice or missing, a seed alone)."""
    frame = pd.DataFrame({"value": np.asarray(values, float), "init": list(init), "data": list(data)})
    if frame["value"].isna().any():
        raise ValueError("variance_components: a value is NaN; leave such runs out first")
    if frame.duplicated(["init", "data"]).any():
        raise ValueError("variance_components: an (init, data) pair has several runs; the decomposition"
                         " takes one run per pair")
    grid = frame.pivot(index="init", columns="data", values="value")
    a, b = grid.shape
    if a < 2 or b < 2 or grid.isna().to_numpy().any():
        raise ValueError(f"variance_components: the runs are not a complete grid of at least 2 init x 2 data"
                         f" seeds ({a} init seeds x {b} data seeds, {len(frame)} runs)")
    y = grid.to_numpy(float)
    grand, rows, cols = y.mean(), y.mean(axis=1), y.mean(axis=0)
    ms_init = b * float(np.sum((rows - grand) ** 2)) / (a - 1)
    ms_data = a * float(np.sum((cols - grand) ** 2)) / (b - 1)
    ms_res = float(np.sum((y - rows[:, None] - cols[None, :] + grand) ** 2)) / ((a - 1) * (b - 1))
    raw_init, raw_data = (ms_init - ms_res) / b, (ms_data - ms_res) / a
    parts = {"init": max(raw_init, 0.0), "data": max(raw_data, 0.0), "residual": ms_res}
    total = sum(parts.values())
    return {"n_init": a, "n_data": b, "total_var": float(np.var(y, ddof=1)),
            "ms_init": ms_init, "ms_data": ms_data, "ms_residual": ms_res,
            **{f"var_{k}": v for k, v in parts.items()},
            **{f"share_{k}": v / total if total > 0 else math.nan for k, v in parts.items()},
            "init_truncated": raw_init < 0, "data_truncated": raw_data < 0}


def seed_sources(df: pd.DataFrame, by: Sequence[str] | None = None) -> pd.DataFrame:
    """`variance_components` per cell (family, size, cell keys, metric) of the long table of
    `analysis.load`, for the cells whose finite values form a complete grid of init x data seeds
    (columns init_seed and data_seed, which `analysis.load` adds where a run sets them), at one
    configured seed. Empty (with SEED_SOURCE_COLUMNS and the cell keys) without such cells."""
    keys = _keys(df, by)
    columns = _after_size(SEED_SOURCE_COLUMNS, keys)
    if df.empty or not {"init_seed", "data_seed"} <= set(df.columns):
        return pd.DataFrame(columns=columns)
    cell_columns = ["family", "size", *keys, "metric"]
    rows = []
    values = df[np.isfinite(df["value"].astype(float))]
    for cell_values, cell in values.groupby(cell_columns, sort=True, dropna=False):
        if cell["metric"].iloc[0] and is_reference(cell["metric"].iloc[0]):
            continue
        if "config_seed" in cell.columns and cell["config_seed"].nunique(dropna=False) > 1:
            continue  # evaluations follow the configured seed: runs at several are not one grid
        try:
            parts = variance_components(cell["value"], cell["init_seed"], cell["data_seed"])
        except ValueError:
            continue
        rows.append({**dict(zip(cell_columns, cell_values)), **parts})
    return pd.DataFrame(rows, columns=columns)
