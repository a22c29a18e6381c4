"""Power of the t-test and seeds_needed (docs/statistics.md, e) for standardised effects from 0.1 to
20, paired and unpaired: statsmodels' power function returns NaN for large effects (its lower tail
comes from scipy's nct.cdf), which seeds_needed used to read as "power not reached" (dz 11.25
gave 9 seeds instead of 3)."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import integrate, special, stats
from statsmodels.stats.power import TTestIndPower, TTestPower

from analysis.sequential import next_seeds
from analysis.stats import seeds_needed
from analysis.stats import SEEDS_MAX, t_power
from test_stats import frame

EFFECTS = [0.1, 0.25, 0.5, 0.8, 1.0, 1.155, 2.0, 3.0, 4.04, 5.0, 8.0, 11.25, 15.0, 20.0]
SIZES = [2, 3, 4, 5, 8, 9, 10, 20, 50]
LEVELS = [0.05, 0.05 / 3]


def definition(effect: float, n: int, alpha: float, paired: bool) -> float:
    """Two-sided t-test power straight from T = (Z + nc) / sqrt(V / df), integrated over Z (the
    library integrates over V, when at all): T > c iff Z + nc > 0 and V < df (Z + nc)^2 / c^2."""
    df = n - 1 if paired else 2 * n - 2
    nc = effect * math.sqrt(n if paired else n / 2)
    c = stats.t.ppf(1 - alpha / 2, df)

    def inside(z):  # standard normal density times the chi-square(df) cdf
        return math.exp(-z * z / 2) / math.sqrt(2 * math.pi) * special.chdtr(df, df * (z + nc) ** 2 / c**2)

    upper = integrate.quad(inside, max(-nc, -40.0), 40.0, limit=200, epsabs=1e-13)[0] if -nc < 40 else 0.0
    lower = integrate.quad(inside, -40.0, -nc, limit=200, epsabs=1e-13)[0] if -nc > -40 else 0.0
    return upper + lower


def statsmodels_power(effect, n, alpha, paired):
    analysis = TTestPower() if paired else TTestIndPower()
    return analysis.power(effect, n, alpha)


@pytest.mark.parametrize("paired", [True, False])
@pytest.mark.parametrize("alpha", LEVELS)
def test_t_power_matches_statsmodels_where_statsmodels_is_finite(paired, alpha):
    effect, n = np.meshgrid(EFFECTS, SIZES, indexing="ij")
    ours = t_power(effect, n, alpha, paired)
    with np.errstate(all="ignore"):
        theirs = statsmodels_power(effect, n, alpha, paired)
    finite = np.isfinite(theirs)
    assert np.isfinite(ours).all() and ((0 <= ours) & (ours <= 1)).all()
    np.testing.assert_allclose(ours[finite], theirs[finite], atol=1e-10)
    assert (~finite).any()  # the grid reaches statsmodels' NaNs (from dz 2 at large n), which t_power fills


@pytest.mark.parametrize("paired", [True, False])
@pytest.mark.parametrize("alpha", LEVELS)
def test_t_power_matches_its_definition_from_01_to_20(paired, alpha):
    for effect in EFFECTS:
        for n in SIZES:
            assert t_power(effect, n, alpha, paired) == pytest.approx(definition(effect, n, alpha, paired), abs=1e-7)


def test_t_power_worked_values():
    """The numbers of statistics.md (e), and hand-checked large effects: with 2 pairs (df 1) dz 11.25
    has power 0.788, with 3 pairs it is above 0.99999."""
    assert t_power(0.02 / 0.017321, 8) == pytest.approx(0.799, abs=1e-3)
    assert t_power(0.02 / 0.017321, 9) == pytest.approx(0.857, abs=1e-3)
    assert t_power(0.07 / 0.017321, 3) == pytest.approx(0.913, abs=1e-3)
    assert t_power(2.0, 5, paired=False) == pytest.approx(0.791, abs=1e-3)
    assert t_power(2.0, 6, paired=False) == pytest.approx(0.876, abs=1e-3)
    assert t_power(11.25, 2) == pytest.approx(0.78807, abs=1e-5)
    assert t_power(11.25, 3) > 0.99999
    assert t_power(-2.0, 5) == t_power(2.0, 5)  # two-sided: the sign of the effect does not matter
    assert t_power(0.0, 5) == pytest.approx(0.05, abs=1e-12)  # no effect: the test's level


def test_t_power_falls_back_to_integration_where_scipy_gives_nan(monkeypatch):
    """Should scipy's upper tail ever be NaN too, the power is integrated from the definition."""
    real_sf = stats.nct.sf
    monkeypatch.setattr(stats.nct, "sf", lambda *a: np.full(np.broadcast(*a).shape, np.nan))
    effect, n = np.array([0.5, 3.0, 11.25, 20.0]), np.array([5, 4, 3, 2])
    fallback = t_power(effect, n)
    monkeypatch.setattr(stats.nct, "sf", real_sf)
    np.testing.assert_allclose(fallback, t_power(effect, n), atol=1e-8)


def is_smallest(n: int, effect: float, alpha: float, paired: bool, max_seeds: int) -> bool:
    """Whether n is the smallest seed count from 2 reaching 80% power by `definition` (power grows
    with n), max_seeds + 1 meaning that max_seeds does not."""
    if n == max_seeds + 1:
        return definition(effect, max_seeds, alpha, paired) < 0.8
    return definition(effect, n, alpha, paired) >= 0.8 and (n == 2 or definition(effect, n - 1, alpha, paired) < 0.8)


@pytest.mark.parametrize("paired", [True, False])
def test_seeds_needed_from_01_to_20(paired):
    for effect in EFFECTS:
        assert is_smallest(seeds_needed(1.0, effect, paired=paired), effect, 0.05, paired, SEEDS_MAX), effect
        assert is_smallest(seeds_needed(1.0, effect, 0.05 / 3, paired=paired, max_seeds=8), effect, 0.05 / 3,
                           paired, 8), effect
    needed = [seeds_needed(1.0, effect, paired=paired) for effect in np.linspace(0.1, 20, 200)]
    assert all(a >= b for a, b in zip(needed, needed[1:]))  # a larger effect never needs more seeds


def test_seeds_needed_dz_11_25_is_3_not_9():
    assert seeds_needed(1.0, 11.25) == 3  # statsmodels: NaN power at 3..8 pairs, so 9 was returned
    assert seeds_needed(0.0016, 0.018) == 3  # the same dz in a metric's own units
    assert seeds_needed(1.0, 20.0) == 2 and seeds_needed(1.0, 20.0, paired=False) == 2
    assert seeds_needed(1.0, 11.25, paired=False) == 2


def test_a_large_gap_on_a_short_cell_is_not_futile():
    """At look 1, size small lost a seed (2 pairs, so its seed noise is pooled with size tiny): the
    planned dz 11.5 reaches 80% power with 3 pairs at level alpha/3. statsmodels' NaN power made this
    comparison futile (seeds_to_decide 9 > S_max 8)."""
    dense = [0.30, 0.28, 0.33]
    tiny = frame({"dense": dense, "lidas": list(np.add(dense, [0.070, 0.073, 0.067]))}, metric="regbench_acc")
    small = frame({"dense": dense, "lidas": list(np.add(dense[:2], [0.037, 0.043]))}, metric="regbench_acc",
                  size="small")
    plan = next_seeds(pd.concat([tiny, small]), primary_metrics=("regbench_acc",))
    row = plan.comparisons.set_index("size").loc["small"]
    assert row["sigma_pooled"] and row["plan_delta"] / row["sigma"] == pytest.approx(11.55, abs=0.01)
    assert row["seeds_to_decide"] == 3 and row["verdict"] == "continue"
    assert t_power(row["plan_delta"] / row["sigma"], 5, 0.05 / 3) > 0.98  # the next look's power
    assert plan.decision == "continue" and plan.n_more == 2


def holm_rows(p: np.ndarray) -> np.ndarray:
    """Holm's adjusted p-values of each row at once: sorted, scaled by m, m - 1, ..., 1, then a
    running maximum (the step-down), capped at 1 and put back in the row's order."""
    m = p.shape[1]
    order = np.argsort(p, axis=1)
    steps = np.maximum.accumulate(np.take_along_axis(p, order, axis=1) * (m - np.arange(m)), axis=1)
    adjusted = np.empty_like(p)
    np.put_along_axis(adjusted, order, np.minimum(steps, 1.0), axis=1)
    return adjusted


@pytest.mark.parametrize("m", [2, 4, 6])
def test_recommended_seeds_give_the_power_after_holm(m):
    """seeds_needed at Holm's first-step level alpha / m: with that many paired seeds, each of m true
    improvements (0.02 against seed noise 0.02) is found after Holm in at least 80% of 20,000
    simulated sweeps. Holm is applied to all rows at once, checked against analysis.stats.holm on
    the first 20 (statsmodels' multipletests collects garbage on every call: 50 ms each)."""
    from analysis.stats import holm
    sigma, delta, alpha = 0.02, 0.02, 0.05
    n = seeds_needed(sigma, delta, alpha / m)
    diffs = delta + sigma * np.random.default_rng(m).standard_normal((20_000, m, n))
    t = diffs.mean(-1) / (diffs.std(-1, ddof=1) / np.sqrt(n))
    p = 2 * stats.t.sf(np.abs(t), n - 1)
    adjusted = holm_rows(p)
    np.testing.assert_allclose(adjusted[:20], [holm(row) for row in p[:20]], atol=1e-12)
    power = ((adjusted < alpha) & (t > 0)).mean()
    assert power >= 0.8, (m, n, power)
    assert seeds_needed(sigma, delta, alpha) < n  # the uncorrected level would promise too few seeds


def test_seeds_needed_of_an_unknown_gap_or_noise_is_not_a_number():
    with pytest.raises(ValueError):
        seeds_needed(0.02, float("nan"))
    with pytest.raises(ValueError):
        seeds_needed(float("nan"), 0.02)


# ---- the minimum detectable effect, the inverse of seeds_needed --------------------------------

@pytest.mark.parametrize("paired", [True, False])
@pytest.mark.parametrize("alpha", [0.05, 0.05 / 4, 0.05 / 24])
def test_mde_is_where_the_power_reaches_80_percent(paired, alpha):
    """t_power at mde / sigma is 0.8 (by the definition's integral too), and seeds_needed for a gap a
    hair above mde(n) is n: the two are inverses, at the levels the dry run plans at."""
    from analysis.stats import mde
    for n in (2, 3, 5, 8, 20):
        gap = mde(0.02, n, alpha, paired=paired)
        assert t_power(gap / 0.02, n, alpha, paired) == pytest.approx(0.8, abs=1e-9)
        assert definition(gap / 0.02, n, alpha, paired) == pytest.approx(0.8, abs=1e-6)
        assert seeds_needed(0.02, gap * (1 + 1e-6), alpha, paired=paired, max_seeds=60) == n
        assert seeds_needed(0.02, gap * (1 - 1e-6), alpha, paired=paired, max_seeds=60) == n + 1
    gaps = [mde(0.02, n, alpha, paired=paired) for n in range(2, 30)]
    assert all(a > b for a, b in zip(gaps, gaps[1:]))  # more seeds, a smaller detectable gap


def test_mde_worked_values():
    """statistics.md (e): Example A's sigma 0.017321 with 3 pairs at alpha 0.05: 0.05654 (dz 3.264);
    seed sd 0.02 with 3 pairs under Holm over 4 comparisons (0.0125): 0.1309 (dz 6.546); at 8 seeds
    0.03063 (dz 1.532)."""
    from analysis.stats import effect_for_power, mde
    assert mde(0.017321, 3) == pytest.approx(0.05654, abs=1e-5)
    assert effect_for_power(3) == pytest.approx(3.264, abs=1e-3)
    assert mde(0.02, 3, 0.05 / 4) == pytest.approx(0.1309, abs=1e-4)
    assert mde(0.02, 8, 0.05 / 4) == pytest.approx(0.03063, abs=1e-5)
    assert mde(0.0, 3) == 0.0


@pytest.mark.parametrize("call", [
    lambda mde: mde(float("nan"), 3), lambda mde: mde(-0.01, 3), lambda mde: mde(0.02, 1),
    lambda mde: mde(0.02, 3, float("nan")), lambda mde: mde(0.02, 3, 0.05, float("nan")),
    lambda mde: mde(0.02, float("nan"))])
def test_mde_of_unknown_noise_or_too_few_seeds_is_not_a_number(call):
    from analysis.stats import mde
    with pytest.raises(ValueError):
        call(mde)


def test_seeds_needed_at_an_unknown_level_is_not_a_number():
    """t_power at a NaN level is NaN, which the search would read as 'never reached': '> 50'."""
    with pytest.raises(ValueError):
        seeds_needed(0.02, 0.02, float("nan"))
    with pytest.raises(ValueError):
        seeds_needed(0.02, 0.02, 0.05, float("nan"))


# ---- NaN inputs never become a planned number ---------------------------------------------------

def one_seed_lidas(**kw) -> pd.DataFrame:
    """dense with 3 seeds, looped with 3, lidas with only seed 0 finite (seeds 1 and 2 NaN): the lidas
    comparison has 1 pair and, with one size, no seed noise to borrow."""
    dense = [0.30, 0.28, 0.33]
    return frame({"dense": dense, "looped": [0.25, 0.27, 0.26], "lidas": [0.20, math.nan, math.nan]},
                 metric="regbench_acc", **kw)


@pytest.mark.parametrize("looks, verdict", [((3, 5, 8), "continue"), ((3,), "inconclusive")])
def test_next_seeds_with_unknown_seed_noise_plans_no_number(looks, verdict):
    """Unknown seed noise: seeds_to_decide and seeds_needed are NA (never > S_max, so never futile);
    the comparison continues, or is inconclusive at the last look; its record says None."""
    plan = next_seeds(one_seed_lidas(), looks=looks, primary_metrics=("regbench_acc",))
    row = plan.comparisons.set_index("family").loc["lidas"]
    assert np.isnan(row["sigma"]) and row["n_pairs"] == 1
    assert pd.isna(row["seeds_to_decide"]) and pd.isna(row["seeds_needed"]) and pd.isna(row["seeds_needed_observed"])
    assert row["verdict"] == verdict
    recorded = next(c for c in plan.to_record()["comparisons"] if c["family"] == "lidas")
    assert recorded["seeds_to_decide"] is None
    looped = plan.comparisons.set_index("family").loc["looped"]
    assert pd.notna(looped["seeds_to_decide"])  # the other comparison is planned as before


def test_the_reports_planning_table_says_unknown(tmp_path):
    """The report's seeds for 80% power: "unknown" (and why) for a comparison without seed noise
    (lidas: one finished seed) or without a declared margin (a delta_min mapping that lacks the
    metric), never a number made from a NaN."""
    from test_analysis_load import new_store, write_run, write_sweep
    from test_report import markdown_table, section

    from analysis import AnalysisOptions, analyse
    from analysis.markdown import render_markdown

    root = new_store(tmp_path / "store")
    run_ids = []
    for row in one_seed_lidas().itertuples():
        if math.isnan(row.value):
            continue
        run_ids.append(f"{row.family}-{row.seed}")
        write_run(root, run_ids[-1], row.family, "tiny", row.seed, {"regbench_tvd": row.value})
    write_sweep(root, "demo", run_ids, "2025-01-01T00:00:00", [])
    analysis = analyse(root, "demo")
    report = render_markdown(analysis, figures=[])
    needed = {r["comparison"]: r for r in markdown_table(section(report, "How sure are we"), "- **Seeds needed**")}
    lidas = needed["lidas vs dense, RegBench TVD, tiny"]
    assert [lidas[c] for c in ("seeds at the observed noise", "seeds if the noise is at its 80% upper bound",
                               "seeds for the observed gap")] == ["unknown"] * 3
    rows = {r["family"]: r for r in markdown_table(report, "**RegBench TVD against dense** (confirmatory, Holm)")}
    assert rows["lidas"]["seeds for 80% power"] == "unknown" and rows["looped"]["seeds for 80% power"].isdigit()
    assert "seeds for 80% power unknown (no estimate of the seed noise)" in report
    unmargined = analyse(root, "demo", AnalysisOptions(delta_min={"regbench_acc": 0.01}))
    report = render_markdown(unmargined, figures=[])
    needed = {r["comparison"]: r for r in markdown_table(section(report, "How sure are we"), "- **Seeds needed**")}
    looped = needed["looped vs dense, RegBench TVD, tiny"]
    assert looped["gap (delta_min)"] == "none declared" and looped["seeds at the observed noise"] == "unknown"
    assert looped["seeds for the observed gap"].isdigit()  # the observed gap needs no margin
    assert "no delta_min declared for this metric" in report
