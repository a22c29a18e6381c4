"""Adding seeds until decisive: the pre-declared group-sequential stopping rule (design/statistics.md, f).

Re-testing at 95% after every new seed and stopping when the interval excludes 0 inflates the
false-positive rate, so seeds are added in a declared schedule of looks (default n = 3, 5, 8; K = 3,
S_max = 8) and every look tests at 1 - alpha/K (Bonferroni over looks, valid under any dependence),
with Holm across the confirmatory cells on top. Estimates from an early stop are biased away from 0
(winner's curse).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.stats import cell_keys, compare, seeds_needed

SETTLED = ("better", "worse", "equivalent")  # compare's verdicts that end a comparison


@dataclass(frozen=True)
class SeedPlan:
    """The decision at the current look: continue (add n_more seeds per family to reach the next look),
    stop (decisive, equivalent or futile), or inconclusive once S_max is reached with comparisons open."""
    decision: str
    n_more: int
    look: int  # k of n_looks; 0 before the first look
    n_looks: int
    n_seeds: int  # distinct seeds with results so far
    level: float  # 1 - alpha / n_looks, the level of every interval
    comparisons: pd.DataFrame


def _check_looks(looks: Sequence[int]) -> tuple[int, ...]:
    looks = tuple(int(n) for n in looks)
    if not looks or looks[0] < 2 or any(a >= b for a, b in zip(looks, looks[1:])):
        raise ValueError(f"looks must be increasing seed counts from 2 up, got {looks}")
    return looks


def _verdict(row: pd.Series, look: int, n_looks: int, s_max: int) -> str:
    if look == 0:
        return "continue"  # nothing is tested before the first look
    if row["verdict"] in SETTLED:
        return row["verdict"]
    if pd.notna(row["seeds_to_decide"]) and row["seeds_to_decide"] > s_max:
        return "futile"
    return "continue" if look < n_looks else "inconclusive"


def _decision(verdicts: pd.Series, look: int, n_looks: int) -> str:
    """continue while any comparison continues; at S_max, inconclusive while any is open; otherwise
    the stop names the weakest outcome: futile if any comparison is futile, equivalent if all are
    equivalent, else decisive (every comparison better, worse or equivalent, at least one of the first)."""
    if look == 0 or (verdicts == "continue").any():
        return "continue"
    if (verdicts == "inconclusive").any():
        return "inconclusive"
    if (verdicts == "futile").any():
        return "stop: futile"
    return "stop: equivalent" if (verdicts == "equivalent").all() else "stop: decisive"


def next_seeds(df: pd.DataFrame, *, looks: Sequence[int] = (3, 5, 8), alpha: float = 0.05,
               delta_min: float | Mapping[str, float] = 0.02, baseline: str = "dense", pairing: str = "paired",
               primary_metrics: Sequence[str] = ("regbench_tvd",), seed: int = 0,
               by: Sequence[str] | None = None) -> SeedPlan:
    """Where the sweep stands in its look schedule, and whether to add seeds.

    n_seeds counts the distinct seeds with a finite primary-metric result. The current look k is the
    last look with looks[k-1] <= n_seeds, and it is analysed on exactly the looks[k-1] smallest seeds:
    seeds run beyond a look wait for the next one, so re-running between looks gives the same verdicts
    and the count of looks stays honest. A run that failed leaves its comparison with fewer pairs at
    that look (n_pairs shows it).

    `comparisons` is `compare` on the confirmatory family (every family != baseline x size x cell keys
    x primary metric) at alpha / K, so ci_* are 1 - alpha/K intervals, tost_* are 1 - 2 alpha/K
    intervals, p_holm is Holm across cells and compare's own planning columns are at alpha/K too; then
    plan_delta, seeds_to_decide, n_more, look and n_looks. verdict: better / worse (Holm p < alpha/K and
    the interval excludes 0 on that side), equivalent (the tost interval inside +-delta_min), futile
    (seeds_to_decide > S_max), else continue, or inconclusive at S_max; before the first look
    everything continues.
    seeds_to_decide is the seeds for 80% power at level alpha/K for plan_delta = max(|diff_mean|,
    delta_min), with the observed (or pooled) sigma; S_max + 1 means more than S_max. Planning at the
    observed gap when it exceeds delta_min keeps a large but not yet significant gap (Example A at
    look 1: 0.07 with sigma 0.017) from being called futile merely because a 0.02 gap would need more
    seeds than S_max. n_more: seeds per family to add to reach the next look (0 when stopping).
    """
    looks = _check_looks(looks)
    n_looks, s_max, level_alpha = len(looks), looks[-1], alpha / len(looks)
    keys = cell_keys(df) if by is None else list(by)
    primary = df[df["metric"].isin(primary_metrics) & np.isfinite(df["value"])]
    seeds = sorted(primary["seed"].unique())
    look = bisect.bisect_right(looks, len(seeds))
    at_look = primary[primary["seed"].isin(seeds[:looks[look - 1]])] if look else primary
    table = compare(at_look, baseline, pairing, primary_metrics, level_alpha, delta_min, seed, by=keys)
    if table.empty and look:
        raise ValueError(f"no comparison of a primary metric {tuple(primary_metrics)} against {baseline!r}")
    n_more = looks[look] - len(seeds) if look < n_looks else 0
    table["plan_delta"] = np.fmax(table["diff_mean"].abs(), table["delta_min"])
    table["seeds_to_decide"] = pd.array([
        seeds_needed(r.sigma, r.plan_delta, level_alpha, paired=r.pairing == "paired", max_seeds=s_max)
        if np.isfinite(r.sigma) and np.isfinite(r.plan_delta) else pd.NA
        for r in table.itertuples()], dtype="Int64")
    verdicts = pd.Series([_verdict(row, look, n_looks, s_max) for _, row in table.iterrows()], index=table.index,
                         dtype=object)
    table["n_more"] = np.where(verdicts == "continue", n_more, 0)
    table["look"], table["n_looks"] = look, n_looks
    table["verdict"] = verdicts
    columns = [c for c in table.columns if c != "verdict"] + ["verdict"]
    decision = _decision(verdicts, look, n_looks)
    return SeedPlan(decision=decision, n_more=n_more if decision == "continue" else 0, look=look, n_looks=n_looks,
                    n_seeds=len(seeds), level=1 - level_alpha, comparisons=table[columns])
