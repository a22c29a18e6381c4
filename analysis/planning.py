"""Before a sweep runs: the smallest difference its seeds can detect (docs/statistics.md, "Before a
sweep: what its seeds can detect"). The dry run states it per confirmatory metric, so that a
researcher knows before spending compute whether 3 seeds can answer anything.

The comparisons are the report's: each family other than the baseline against the baseline at the
same size and cell keys (`cell_keys`, found on the planned configs as on the finished runs), paired
by seed. They are planned at the level the correction applies first: Holm over the m confirmatory
comparisons starts at alpha / m, and an adaptive sweep's rule tests each of its K looks at alpha / K
(Bonferroni), so there alpha / (K m), with S_max seeds. The seed noise is a pilot's (an earlier run of
the same sweep: its paired differences' seed sd, pooled over its comparisons) or a declared one
(adaptive.seed_sd); where neither is known, so is the detectable difference: it is then "unknown",
never a number made from a NaN."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from analysis.stats import cell_keys, compare, effect_for_power, pooled_std

POWER = 0.8


@dataclass(frozen=True)
class SeedSd:
    """The seed sd of a comparison's paired difference (candidate - baseline) for one metric, and
    where it comes from ("pilot sweep x: 4 comparisons, 8 df", "declared in adaptive.seed_sd"), or
    NaN and why it is unknown."""
    value: float
    source: str


def planned_comparisons(arms: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """The comparisons a grid will make, with the seeds each can pair.

    `arms` has one row per planned run config apart from its seed: family, size, the config's dotted
    keys (`analysis.load.flat_config`) and `seeds`, the set of seeds planned with it. Rows whose cell
    keys agree form one arm (their seeds joined). Returns family, baseline, size, the cell keys and
    n_pairs, the seeds both the family's arm and the baseline's arm at the same size and cell keys
    plan; arms without a baseline arm there are not compared, as in `compare`."""
    table = arms.assign(seed=0, run_id="", sweep="", metric="", value=0.0, higher_is_better=True)
    keys = cell_keys(table.drop(columns="seeds"))
    setting = ["size", *keys]
    joined = {name: frozenset().union(*group["seeds"])
              for name, group in arms.groupby(["family", *setting], sort=True, dropna=False)}
    rows = []
    for (family, *where), seeds in joined.items():
        partner = joined.get((baseline, *where))
        if family == baseline or partner is None:
            continue
        rows.append({"family": family, "baseline": baseline, **dict(zip(setting, where)),
                     "n_pairs": len(seeds & partner)})
    return pd.DataFrame(rows, columns=["family", "baseline", *setting, "n_pairs"])


def pilot_sd(values: pd.DataFrame, metrics: Sequence[str], baseline: str) -> dict[str, tuple[float, int, int]]:
    """metric -> (sd, df, comparisons) from a recorded sweep's long table (`analysis.load`): the seed
    sd of the paired differences against `baseline`, pooled over its comparisons of that metric
    (`compare`'s diff_std, n_pairs - 1 df each; `pooled_std`). NaN with 0 df where no comparison has
    2 pairs. Metrics the sweep did not compare are left out."""
    table = compare(values[values["metric"].isin(metrics)], baseline, "paired", tuple(metrics))
    out = {}
    for metric, rows in table.groupby("metric", sort=True):
        sd, df = pooled_std(rows["diff_std"], rows["n_pairs"])
        out[str(metric)] = (sd, df, len(rows))
    return out


def level_text(alpha: float, n_looks: int, m: int) -> str:
    return f"{alpha:g}/{m}" if n_looks == 1 else f"{alpha:g}/{n_looks} looks/{m}"


def detectable_lines(comparisons: pd.DataFrame, metrics: Sequence[str], sds: Mapping[str, SeedSd],
                     alpha: float = 0.05, n_looks: int = 1, power: float = POWER,
                     seeds_note: str = "") -> list[str]:
    """One line per confirmatory metric and seed count: the smallest |difference| each comparison
    detects with `power` at Holm's first-step level alpha / (n_looks m), m = the comparisons x
    metrics with 2 seeds or more (the testable ones, which Holm counts), with the metric's seed sd
    (`mde` = sd x `effect_for_power`). Where the sd is unknown, "unknown" and why, with the effect in
    units of the sd; with fewer than 2 seeds, "nothing". `seeds_note` follows the seed count (the
    adaptive rule's "(adaptive.max_seeds, the last look)")."""
    baseline = comparisons["baseline"].iloc[0] if len(comparisons) else ""
    if comparisons.empty or not metrics:
        return ["detectable: nothing to compare; the grid has no family beside the baseline at the same size and"
                " cell keys, or no confirmatory metric"]
    testable = comparisons[comparisons["n_pairs"] >= 2]
    m = len(testable) * len(metrics)
    level = alpha / n_looks / max(1, m)
    lines = []
    for metric in metrics:
        for n, group in comparisons.groupby("n_pairs", sort=True):
            n = int(n)
            what = f"{len(group)} comparison{'s' if len(group) > 1 else ''} with {baseline}"
            if n < 2:
                lines.append(f"detectable with {n} seed{'s' if n != 1 else ''}{seeds_note}: nothing on {metric}"
                             f" ({what}: a test needs 2 seeds of both families)")
                continue
            effect = effect_for_power(n, level, power)
            sd = sds.get(metric, SeedSd(math.nan, "unknown"))
            holm = f"Holm level {level:.3g} = {level_text(alpha, n_looks, m)}"
            head = f"detectable at {power:.0%} power with {n} seeds{seeds_note}:"
            if math.isfinite(sd.value):
                lines.append(f"{head} |difference| >= {sd.value * effect:.3g} on {metric} ({what}; {effect:.3g} x"
                             f" seed sd {sd.value:.3g} {sd.source}, {holm})")
            else:
                lines.append(f"{head} |difference| on {metric} unknown ({sd.source}); it is {effect:.3g} x the seed"
                             f" sd of the difference ({what}, {holm})")
    return lines
