"""The whole group-sequential procedure in simulation (docs/statistics.md, f): two families
against a baseline, looks at 3, 5 and 8 seeds, settled verdicts kept, new seeds only to open arms.

`next_seeds` runs a full `compare` per look (sign-flip tests, Holm through statsmodels), too slow for
thousands of sweeps, so `rule` below re-implements exactly the same decision, vectorised over
simulated sweeps, from the same building blocks (`verdict_rule`, `t_power`); `test_rule_agrees_with_
next_seeds` drives `next_seeds` look by look, seeds only to `plan.open_arms` and the settled verdicts
read back from a YAML record, on sweeps picked to cover every outcome, and checks both give the same
verdicts at the same looks."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.sequential import FINAL, SETTLED, SeedPlan, next_seeds, settled_verdicts
from analysis.stats import t_power, verdict_rule

LOOKS = (3, 5, 8)
ALPHA, DELTA_MIN = 0.05, 0.02
FAMILIES = ("f1", "f2")
METRIC = "regbench_acc"


def sweeps(rng: np.random.Generator, n_sweeps: int, gaps, noise: float) -> tuple[np.ndarray, np.ndarray]:
    """Seed values of n_sweeps simulated sweeps, S_max seeds each: the baseline (n_sweeps, S_max) and the
    families (n_sweeps, families, S_max). Seeds share a seed effect (sd 0.02) across families, as paired
    seeds do; each run adds its own noise; family f is better by gaps[f]."""
    shared = 0.02 * rng.standard_normal((n_sweeps, 1, LOOKS[-1]))
    base = 0.3 + shared + noise * rng.standard_normal((n_sweeps, 1, LOOKS[-1]))
    fam = 0.3 + np.asarray(gaps, float)[None, :, None] + shared + noise * rng.standard_normal(
        (n_sweeps, len(gaps), LOOKS[-1]))
    return base[:, 0], fam


def holm_rows(p: np.ndarray) -> np.ndarray:
    """Holm adjusted p-values within each row."""
    m = p.shape[1]
    order = np.argsort(p, axis=1, kind="stable")
    adjusted = np.minimum(1, np.maximum.accumulate(np.take_along_axis(p, order, 1) * (m - np.arange(m)), axis=1))
    out = np.empty_like(adjusted)
    np.put_along_axis(out, order, adjusted, 1)
    return out


def rule(diff: np.ndarray, looks=LOOKS, alpha: float = ALPHA, delta_min: float = DELTA_MIN,
         per_look_alpha: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """next_seeds' procedure on paired differences (sweeps, families, S_max): at look k only the
    comparisons still open are tested, on their first looks[k-1] seeds, with the paired t-test at
    alpha / K, Holm across the families with the settled ones at p = 1, `verdict_rule`, then futile
    when 80% power at plan_delta = max(|mean|, delta_min) needs more than S_max seeds, else continue
    (inconclusive at the last look). Returns the verdicts and the look that settled each (0: none).
    per_look_alpha replaces alpha / K (to show what testing every look at full alpha would do)."""
    n_sweeps, n_families, _ = diff.shape
    level_alpha = alpha / len(looks) if per_look_alpha is None else per_look_alpha
    verdict = np.full((n_sweeps, n_families), "continue", dtype=object)
    settled_at = np.zeros((n_sweeps, n_families), int)
    for look, n in enumerate(looks, 1):
        open_ = verdict == "continue"
        if not open_.any():
            break
        d = diff[:, :, :n]
        mean, sd = d.mean(-1), d.std(-1, ddof=1)
        se = sd / math.sqrt(n)
        p = 2 * stats.t.sf(np.abs(mean / se), n - 1)
        p_holm = holm_rows(np.where(open_, p, 1.0))
        half, tost = stats.t.ppf(1 - level_alpha / 2, n - 1) * se, stats.t.ppf(1 - level_alpha, n - 1) * se
        tested = verdict_rule(p_holm, mean - half, mean + half, mean - tost, mean + tost, delta_min,
                              level_alpha).reshape(mean.shape)
        futile = t_power(np.fmax(np.abs(mean), delta_min) / sd, looks[-1], level_alpha) < 0.8
        still = "continue" if look < len(looks) else "inconclusive"
        new = np.where(np.isin(tested, SETTLED), tested, np.where(futile, "futile", still))
        verdict = np.where(open_, new, verdict)
        settled_at = np.where(open_ & np.isin(new, FINAL), look, settled_at)
    return verdict, settled_at


def rejection_rate(verdict: np.ndarray, columns=slice(None)) -> tuple[float, float]:
    """Share of sweeps with any better / worse among `columns`, and its Monte Carlo standard error."""
    rejected = np.isin(verdict[:, columns], ["better", "worse"])
    rate = float(rejected.reshape(len(verdict), -1).any(1).mean())
    return rate, math.sqrt(max(rate * (1 - rate), 1e-12) / len(verdict))


NULL_SWEEPS, ALT_SWEEPS = 4000, 2000


def test_overall_error_under_the_null_stays_below_alpha():
    """Both families equal to the baseline (run noise 0.01, so differences have sd 0.014): the share of
    sweeps where any comparison is called better or worse stays below alpha + 3 Monte Carlo SE. Testing
    every look at the full alpha (no Bonferroni over looks, same stops) exceeds it, so the simulation
    can tell."""
    base, fam = sweeps(np.random.default_rng(20241), NULL_SWEEPS, (0.0, 0.0), noise=0.01)
    verdict, settled_at = rule(fam - base[:, None])
    rate, se = rejection_rate(verdict)
    assert rate <= ALPHA + 3 * se, (rate, se)
    kinds = pd.Series(verdict.ravel()).value_counts(normalize=True)
    assert kinds[["equivalent", "futile"]].min() > 0.2  # the early stops are exercised ...
    assert (settled_at == 1).mean() > 0.2 and (settled_at == 3).mean() > 0.05  # ... at every look
    naive, naive_se = rejection_rate(rule(fam - base[:, None], delta_min=1e-9, per_look_alpha=ALPHA)[0])
    assert naive > ALPHA + 3 * naive_se, (naive, naive_se)


def test_alternative_finds_the_better_family_and_keeps_the_null_one_clean():
    """f1 better by 0.03 (1.5 margins), f2 equal to the baseline: f1 is called better in at least 90% of
    sweeps, and f2 (a true null whose neighbour is often settled early) is falsely called better or
    worse in at most alpha + 3 Monte Carlo SE of them."""
    base, fam = sweeps(np.random.default_rng(20242), ALT_SWEEPS, (0.03, 0.0), noise=0.007)
    verdict, _ = rule(fam - base[:, None])
    assert (verdict[:, 0] == "better").mean() >= 0.9
    rate, se = rejection_rate(verdict, 1)
    assert rate <= ALPHA + 3 * se, (rate, se)


def long_table(base: np.ndarray, fam: np.ndarray, seeds: dict) -> pd.DataFrame:
    """The long table of analysis.load for one simulated sweep, each arm with the seeds it has run."""
    values = {"dense": base, **dict(zip(FAMILIES, fam))}
    return pd.DataFrame([{"family": family, "size": "tiny", "seed": s, "metric": METRIC, "value": values[family][s],
                          "higher_is_better": True}
                         for family in values for s in range(seeds[family])])


def run_adaptively(base: np.ndarray, fam: np.ndarray) -> tuple[dict, dict]:
    """next_seeds look by look, new seeds only to plan.open_arms, the settled verdicts read back from
    a YAML record of each look as the orchestrator stores it. Returns the final plan's verdict and
    settled_at_look per family, and checks that no arm gets a seed once its comparison is settled."""
    yaml = pytest.importorskip("yaml")
    seeds = dict.fromkeys(["dense", *FAMILIES], LOOKS[0])
    records = []
    while True:
        plan = next_seeds(long_table(base, fam, seeds), looks=LOOKS, alpha=ALPHA, delta_min=DELTA_MIN,
                          primary_metrics=(METRIC,), settled=settled_verdicts(records))
        records.append(yaml.safe_load(yaml.safe_dump(plan.to_record())))
        if plan.decision != "continue":
            break
        for family in seeds:
            if plan.needs_seeds(family, "tiny"):
                seeds[family] += plan.n_more
            else:
                settled = plan.comparisons.set_index("family")
                assert family == "dense" or settled.loc[family, "verdict"] != "continue"
    final = SeedPlan.from_record(records[-1]).comparisons.set_index("family")
    for family in FAMILIES:
        at = final.loc[family, "settled_at_look"]
        if pd.notna(at):
            assert seeds[family] == LOOKS[int(at) - 1]  # no seed after the look that settled it
    return final["verdict"].to_dict(), final["settled_at_look"].to_dict()


def test_rule_agrees_with_next_seeds():
    """On sweeps picked to cover every outcome (a false rejection, equivalence, futility, a verdict at
    each look, one family settled while the other continues), the vectorised rule and next_seeds give
    the same verdicts at the same looks."""
    null_base, null_fam = sweeps(np.random.default_rng(20241), NULL_SWEEPS, (0.0, 0.0), noise=0.01)
    alt_base, alt_fam = sweeps(np.random.default_rng(20242), ALT_SWEEPS, (0.03, 0.0), noise=0.007)
    null_verdict, null_at = rule(null_fam - null_base[:, None])
    alt_verdict, alt_at = rule(alt_fam - alt_base[:, None])
    picks = [
        ("null", np.flatnonzero(np.isin(null_verdict, ["better", "worse"]).any(1))[0]),
        ("null", np.flatnonzero((null_verdict == "futile").any(1) & (null_verdict == "equivalent").any(1))[0]),
        ("null", np.flatnonzero((null_at == 3).any(1) | (null_verdict == "inconclusive").any(1))[0]),
        ("alt", np.flatnonzero((alt_at[:, 0] == 1) & (alt_at[:, 1] >= 2))[0]),
        ("alt", np.flatnonzero((alt_at[:, 0] == 2) & (alt_at[:, 1] == 1))[0]),
    ]
    for kind, i in picks:
        base, fam, verdict, at = ((null_base, null_fam, null_verdict, null_at) if kind == "null"
                                  else (alt_base, alt_fam, alt_verdict, alt_at))
        got, got_at = run_adaptively(base[i], fam[i])
        assert [got[f] for f in FAMILIES] == list(verdict[i]), (kind, i)
        assert [0 if pd.isna(got_at[f]) else int(got_at[f]) for f in FAMILIES] == list(at[i]), (kind, i)


def look_records(verdict: np.ndarray, settled_at: np.ndarray, looks=LOOKS) -> list[dict]:
    """The looks sweep.yaml would record for simulated sweeps of `rule`, one record per look holding
    every sweep that reached it (the sweep's index as the cell key `sim`): a comparison settled at a
    look keeps its verdict at later looks; one still open continues, and is inconclusive at the last."""
    n_sweeps, n_families = verdict.shape
    reached = np.where((settled_at == 0).any(1), len(looks), settled_at.max(1))
    records = []
    for look in range(1, len(looks) + 1):
        comparisons = []
        for sim in np.flatnonzero(reached >= look):
            for f in range(n_families):
                at = int(settled_at[sim, f])
                settled = 0 < at <= look
                shown = verdict[sim, f] if settled or look == len(looks) else "continue"
                comparisons.append({"family": f"f{f + 1}", "size": "tiny", "cell": {"sim": int(sim)}, "metric": METRIC,
                                    "verdict": shown, "settled_at_look": at if settled else None, "p_holm": None})
        records.append({"look": look, "plan": {"n_looks": len(looks), "level": 1 - ALPHA / len(looks),
                                               "comparisons": comparisons}})
    return records


def test_the_report_states_the_rules_verdict_in_every_simulated_sweep():
    """One decision procedure: 2,000 simulated adaptive sweeps of 4 comparisons (two better by 0.02,
    two null), the rule's verdicts recorded look by look; the report's comparisons table (`decided`
    over the fixed-sample table on all seeds) shows the rule's verdict and look in every one of the
    8,000 comparisons, though the fixed-sample re-analysis (fixed_verdict) disagrees in many."""
    from analysis.compute import decided
    n_sweeps, gaps = 2000, (0.02, 0.02, 0.0, 0.0)
    base, fam = sweeps(np.random.default_rng(20245), n_sweeps, gaps, noise=0.01)
    diff = fam - base[:, None]
    verdict, settled_at = rule(diff)
    n = LOOKS[-1]
    mean, se = diff.mean(-1), diff.std(-1, ddof=1) / math.sqrt(n)
    p = 2 * stats.t.sf(np.abs(mean / se), n - 1)
    half, tost = stats.t.ppf(1 - ALPHA / 6, n - 1) * se, stats.t.ppf(1 - ALPHA / 3, n - 1) * se
    fixed = verdict_rule(holm_rows(p), mean - half, mean + half, mean - tost, mean + tost, DELTA_MIN, ALPHA / 3)
    table = pd.DataFrame({
        "family": np.tile([f"f{f + 1}" for f in range(len(gaps))], n_sweeps), "baseline": "dense", "size": "tiny",
        "sim": np.repeat(np.arange(n_sweeps), len(gaps)), "metric": METRIC, "n_pairs": n,
        "diff_mean": mean.ravel(), "ci_low": (mean - half).ravel(), "ci_high": (mean + half).ravel(),
        "p_value": p.ravel(), "correction": "holm", "p_adj": holm_rows(p).ravel(), "p_holm": holm_rows(p).ravel(),
        "ci_level": 1 - ALPHA / 3, "significant": False, "inside_margin": False, "verdict": fixed.ravel()})
    report = decided(table, look_records(verdict, settled_at), ["sim"])
    looks = np.where(settled_at > 0, settled_at, len(LOOKS)).ravel()
    assert (report["verdict"].to_numpy() != verdict.ravel()).sum() == 0
    assert (report["look"].to_numpy(int) != looks).sum() == 0
    assert (report["fixed_verdict"].to_numpy() != verdict.ravel()).sum() > 500  # the re-analysis would differ
    assert report["winners_curse"].to_numpy(bool).sum() == (looks < len(LOOKS)).sum()
